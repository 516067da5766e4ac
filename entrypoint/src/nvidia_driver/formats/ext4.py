"""A small read-only ext4 reader: an ext4 image is read in place, without mounting it.

Reading needs only the superblock, the group descriptors (32/64-bit, meta_bg), inodes, extent
trees and the older block maps, inline data, directories (htree directories are read linearly,
which the format allows) and symlinks. Checksums (metadata_csum) are not verified: the caller
verifies the image as a whole before (a download's digest and signature). orphan_file is a
compat feature that changes nothing for a reader.

Not ``debugfs -R rdump``: debugfs exits 0 when a command fails (a missing path shows only on
stderr), rdump copies hard links as separate files and writes holes as zeros, and the image
would need e2fsprogs. Every read is bounded by the partition, every map by the file's size and
the extraction by limits.py; what is extracted goes through an output.TreeWriter.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from nvidia_driver import limits
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import output
from nvidia_driver.log import say, warn

_CHUNK = 1 << 20
_MAX_SYMLINKS = 40
_EXT4_SUPERBLOCK = 1024
_EXT4_MAGIC = 0xEF53
_EXT4_ROOT_INODE = 2
_EXT4_GOOD_OLD_INODE_SIZE = 128
_EXT4_MIN_BLOCK, _EXT4_MAX_BLOCK = 1024, 65536
_EXT4_MIN_DESC, _EXT4_MAX_DESC = 32, 1024
_EXT4_DESC_64BIT = 0x2C  # a descriptor long enough for bg_inode_table_hi
_COMPAT_SPARSE_SUPER2 = 0x200
_RO_COMPAT_SPARSE_SUPER = 0x1
_INCOMPAT_FILETYPE = 0x2
_INCOMPAT_RECOVER = 0x4
_INCOMPAT_META_BG = 0x10
_INCOMPAT_64BIT = 0x80
_INCOMPAT_UNSUPPORTED = {0x1: "compression", 0x8: "journal_dev", 0x1000: "dirdata"}
_ENCRYPT_FL = 0x800
_EXTENTS_FL = 0x80000
_INLINE_DATA_FL = 0x10000000
_EXTENT_MAGIC = 0xF30A
_EXTENT_INIT_MAX = 32768
_EXTENT_MAX_DEPTH = 5
_BLOCK_POINTERS = 15  # i_block: 12 direct, then single, double and triple indirect
_DIRECT_POINTERS = 12
_INLINE_SIZE = 60  # bytes of i_block, where fast symlinks and inline data live
_XATTR_MAGIC = 0xEA020000
_XATTR_SYSTEM = 7
_DIRENT_HEADER = 8
_MAP_SLACK = 64  # extent entries beyond a file's blocks: index nodes, preallocated extents


class _Run(NamedTuple):
    logical: int  # first block in the file
    physical: int  # first block on the filesystem
    length: int  # blocks


@dataclass(frozen=True)
class _Inode:
    number: int
    mode: int
    size: int
    mtime: int
    links: int
    flags: int
    block: bytes  # i_block
    xattrs: bytes  # the in-inode extended attribute area

    @property
    def kind(self) -> int:
        return stat.S_IFMT(self.mode)


@dataclass
class _Extraction:
    writer: output.TreeWriter
    hardlinks: dict[int, str] = field(default_factory=dict)
    directories: set[int] = field(default_factory=set)
    entries: int = 0


@dataclass(frozen=True)
class _Superblock:
    inodes_count: int
    blocks_count: int
    first_data_block: int
    block_size: int
    blocks_per_group: int
    inodes_per_group: int
    inode_size: int
    desc_size: int
    first_meta_bg: int
    backup_groups: tuple[int, ...]  # sparse_super2's two backup groups
    compat: int
    incompat: int
    ro_compat: int


def _parse_superblock(raw: bytes) -> _Superblock:
    def field_at(offset: int, kind: str = "I") -> int:
        return int(struct.unpack_from("<" + kind, raw, offset)[0])

    incompat = field_at(0x60)
    is64 = bool(incompat & _INCOMPAT_64BIT)
    return _Superblock(
        inodes_count=field_at(0x0),
        blocks_count=field_at(0x4) | (field_at(0x150) << 32 if is64 else 0),
        first_data_block=field_at(0x14),
        block_size=_EXT4_MIN_BLOCK << min(field_at(0x18), 8),
        blocks_per_group=field_at(0x20),
        inodes_per_group=field_at(0x28),
        # Revision 0 filesystems have fixed 128-byte inodes.
        inode_size=field_at(0x58, "H") if field_at(0x4C) else _EXT4_GOOD_OLD_INODE_SIZE,
        desc_size=field_at(0xFE, "H") if is64 else _EXT4_MIN_DESC,
        first_meta_bg=field_at(0x104),
        backup_groups=(field_at(0x24C), field_at(0x250)),
        compat=field_at(0x5C),
        incompat=incompat,
        ro_compat=field_at(0x64),
    )


class Ext4:
    """Reads an ext4 filesystem at ``offset`` in the file open as ``fd``.

    The class attributes are how its messages name the filesystem and what to do about it; a
    caller's subclass says that in its own words.
    """

    WHERE = "the partition"  # what should hold the filesystem
    WHAT = "the filesystem"  # what paths are extracted from
    UNSUPPORTED = "report it"  # what to do about a feature this reader lacks
    THROUGH_LINK = "the image is not what it claims to be, fetch it again"

    def __init__(self, fd: int, offset: int, size: int, label: str) -> None:
        self._fd, self._offset, self._size, self._label = fd, offset, size, label
        raw = self._read(_EXT4_SUPERBLOCK, 1024)
        if struct.unpack_from("<H", raw, 0x38)[0] != _EXT4_MAGIC:
            raise DriverError(f"{label}: {self.WHERE} holds no ext4 filesystem; fetch it again")
        self.sb = _parse_superblock(raw)
        self._tables: dict[int, int] = {}
        self._written = 0  # bytes of file data extracted: no more than the partition holds
        self._check_geometry()
        self._check_features()

    def _check_geometry(self) -> None:
        sane = (
            _EXT4_MIN_BLOCK <= self.sb.block_size <= _EXT4_MAX_BLOCK
            and _EXT4_GOOD_OLD_INODE_SIZE <= self.sb.inode_size <= self.sb.block_size
            and _EXT4_MIN_DESC <= self.sb.desc_size <= _EXT4_MAX_DESC
            and self.sb.blocks_per_group > 0
            and self.sb.inodes_per_group > 0
        )
        if not sane:
            self._corrupt("implausible superblock geometry")
        if self.sb.blocks_count * self.sb.block_size > self._size:
            self._corrupt("the filesystem is larger than its partition")

    def _check_features(self) -> None:
        for flag, name in _INCOMPAT_UNSUPPORTED.items():
            if self.sb.incompat & flag:
                raise DriverError(
                    f"{self._label}: its ext4 filesystem uses {name}, which this reader does "
                    f"not support; {self.UNSUPPORTED}"
                )
        if self.sb.incompat & _INCOMPAT_RECOVER:
            warn(f"{self._label}: its ext4 journal was not replayed; reading it as it is")

    def _corrupt(self, detail: str) -> None:
        raise DriverError(
            f"{self._label}: its ext4 filesystem is corrupt ({detail}); "
            "delete it and fetch it again"
        )

    def _read(self, position: int, length: int) -> bytes:
        if position < 0 or length < 0 or position + length > self._size:
            self._corrupt(f"a read at byte {position} lies beyond the partition")
        data = os.pread(self._fd, length, self._offset + position)
        if len(data) != length:
            self._corrupt(f"the image ends inside the filesystem, at byte {position}")
        return data

    def _blocks(self, number: int, count: int = 1) -> bytes:
        if number + count > self.sb.blocks_count:
            self._corrupt(f"block {number} lies beyond the filesystem")
        return self._read(number * self.sb.block_size, count * self.sb.block_size)

    # Group descriptors and inodes.

    def _has_superblock(self, group: int) -> bool:
        if group <= 1:
            return True
        if self.sb.compat & _COMPAT_SPARSE_SUPER2:
            return group in self.sb.backup_groups
        if not self.sb.ro_compat & _RO_COMPAT_SPARSE_SUPER:
            return True
        for base in (3, 5, 7):
            power = base
            while power < group:
                power *= base
            if power == group:
                return True
        return False

    def _descriptor_position(self, group: int) -> int:
        per_block = self.sb.block_size // self.sb.desc_size
        index, slot = divmod(group, per_block)
        if self.sb.incompat & _INCOMPAT_META_BG and index >= self.sb.first_meta_bg:
            # meta_bg: each meta group's descriptors sit in its own first group.
            first = index * per_block
            block = self.sb.first_data_block + first * self.sb.blocks_per_group
            block += 1 if self._has_superblock(first) else 0
        else:
            block = self.sb.first_data_block + 1 + index
        return block * self.sb.block_size + slot * self.sb.desc_size

    def _inode_table(self, group: int) -> int:
        if group not in self._tables:
            descriptor = self._read(self._descriptor_position(group), self.sb.desc_size)
            (low,) = struct.unpack_from("<I", descriptor, 0x8)
            high = 0
            if self.sb.incompat & _INCOMPAT_64BIT and self.sb.desc_size >= _EXT4_DESC_64BIT:
                (high,) = struct.unpack_from("<I", descriptor, 0x28)
            self._tables[group] = int(low) | int(high) << 32
        return self._tables[group]

    def inode(self, number: int) -> _Inode:
        if not 1 <= number <= self.sb.inodes_count:
            self._corrupt(f"inode {number} out of range")
        group, index = divmod(number - 1, self.sb.inodes_per_group)
        position = self._inode_table(group) * self.sb.block_size + index * self.sb.inode_size
        raw = self._read(position, self.sb.inode_size)
        mode, _, size_lo, _, _, mtime, _, _, links, _, flags = struct.unpack_from(
            "<HHIIIIIHHII", raw, 0
        )
        (size_hi,) = struct.unpack_from("<I", raw, 0x6C)
        xattrs = b""
        if self.sb.inode_size > _EXT4_GOOD_OLD_INODE_SIZE:
            (extra,) = struct.unpack_from("<H", raw, _EXT4_GOOD_OLD_INODE_SIZE)
            xattrs = raw[_EXT4_GOOD_OLD_INODE_SIZE + extra :]
        if flags & _ENCRYPT_FL:
            raise DriverError(f"{self._label}: inode {number} is encrypted and cannot be read")
        block = raw[0x28 : 0x28 + _INLINE_SIZE]
        return _Inode(number, mode, size_lo | size_hi << 32, mtime, links, flags, block, xattrs)

    # File contents.

    def _runs(self, inode: _Inode) -> list[_Run]:
        if inode.flags & _EXTENTS_FL:
            return self._extent_runs(inode)
        return self._blockmap_runs(inode)

    def _map_budget(self, inode: _Inode) -> int:
        """How many block-map or extent entries a file can have: one per block, and some."""
        return min(-(-inode.size // self.sb.block_size), self.sb.blocks_count) + _MAP_SLACK

    def _over_budget(self, inode: _Inode) -> None:
        self._corrupt(f"inode {inode.number} maps more blocks than it has")

    def _extent_runs(self, inode: _Inode) -> list[_Run]:
        """The runs of an extent tree, depth first; its nodes are bounded by the file's blocks."""
        budget = self._map_budget(inode)
        runs: list[_Run] = []
        pending = [(inode.block, _EXTENT_MAX_DEPTH)]
        while pending:
            node, depth_left = pending.pop()
            magic, entries, _, depth = struct.unpack_from("<HHHH", node, 0)
            if magic != _EXTENT_MAGIC or depth > depth_left or 12 + 12 * entries > len(node):
                self._corrupt("a bad extent tree node")
            budget -= entries
            if budget < 0:
                self._over_budget(inode)
            children = []
            for index in range(entries):
                position = 12 + 12 * index
                if depth == 0:
                    logical, length, start_hi, start_lo = struct.unpack_from(
                        "<IHHI", node, position
                    )
                    # Longer than the maximum: unwritten (preallocated) blocks, read as zeros.
                    if length <= _EXTENT_INIT_MAX:
                        runs.append(_Run(logical, start_hi << 32 | start_lo, length))
                else:
                    _, leaf_lo, leaf_hi = struct.unpack_from("<IIH", node, position)
                    child = self._blocks(leaf_hi << 32 | leaf_lo)
                    if struct.unpack_from("<H", child, 6)[0] != depth - 1:
                        self._corrupt("an extent tree of inconsistent depth")
                    children.append((child, depth - 1))
            pending += reversed(children)
        return runs

    def _blockmap_runs(self, inode: _Inode) -> list[_Run]:
        pointers = struct.unpack("<15I", inode.block)
        wanted = -(-inode.size // self.sb.block_size)
        per_block = self.sb.block_size // 4
        mapped: list[tuple[int, int]] = [
            (index, block) for index, block in enumerate(pointers[:_DIRECT_POINTERS]) if block
        ]
        budget = [self._map_budget(inode)]  # indirect blocks read and blocks mapped
        logical = _DIRECT_POINTERS
        for level in range(1, _BLOCK_POINTERS - _DIRECT_POINTERS + 1):
            root = pointers[_DIRECT_POINTERS + level - 1]
            if root and logical < wanted:
                self._indirect(inode, (root, level, logical, wanted), mapped, budget)
            logical += per_block**level
        return _coalesce(mapped)

    def _indirect(
        self,
        inode: _Inode,
        where: tuple[int, int, int, int],
        mapped: list[tuple[int, int]],
        budget: list[int],
    ) -> None:
        block, level, logical, wanted = where
        per_block = self.sb.block_size // 4
        span = per_block ** (level - 1)
        budget[0] -= 1  # this indirect block
        for index, child in enumerate(struct.unpack(f"<{per_block}I", self._blocks(block))):
            start = logical + index * span
            if start >= wanted:
                break
            if budget[0] < 0:
                self._over_budget(inode)
            if child and level == 1:
                budget[0] -= 1
                mapped.append((start, child))
            elif child:
                self._indirect(inode, (child, level - 1, start, wanted), mapped, budget)

    def _inline_data(self, inode: _Inode) -> bytes:
        """The part of an inline-data inode stored in its system.data attribute."""
        area = inode.xattrs
        if area[:4] != struct.pack("<I", _XATTR_MAGIC):
            return b""
        entries = area[4:]
        position = 0
        while position + 16 <= len(entries) and entries[position : position + 4] != bytes(4):
            name_len, index, value_offset, _, value_size = struct.unpack_from(
                "<BBHII", entries, position
            )
            name = entries[position + 16 : position + 16 + name_len]
            if index == _XATTR_SYSTEM and name == b"data":
                return entries[value_offset : value_offset + value_size]
            position += (16 + name_len + 3) & ~3
        return b""

    def _content(self, inode: _Inode) -> bytes:
        """A small file's whole content (directories, slow symlinks)."""
        if inode.size > limits.EXT4_METADATA:
            self._corrupt(f"inode {inode.number} claims {inode.size} bytes")
        if inode.flags & _INLINE_DATA_FL:
            return (inode.block + self._inline_data(inode))[: inode.size]
        content = bytearray(inode.size)
        for run in self._runs(inode):
            start = run.logical * self.sb.block_size
            if start < inode.size:
                # Only the blocks within the size: a run may claim up to 32768 blocks.
                needed = -(-(inode.size - start) // self.sb.block_size)
                data = self._blocks(run.physical, min(run.length, needed))
                content[start : start + len(data)] = data[: inode.size - start]
        return bytes(content[: inode.size])

    def copy_to(self, inode: _Inode, fd: int) -> None:
        """Write a regular file's content to fd, leaving its holes as holes."""
        if inode.flags & _INLINE_DATA_FL:
            output.write_all(fd, self._content(inode))
            return
        for run in self._runs(inode):
            start = run.logical * self.sb.block_size
            length = min(run.length * self.sb.block_size, inode.size - start)
            if length <= 0:
                continue
            if run.physical + run.length > self.sb.blocks_count:
                self._corrupt(f"inode {inode.number} points beyond the filesystem")
            self._written += length
            if self._written > self._size:
                # No file system holds more file data than its partition: blocks are shared.
                self._corrupt(f"its files hold more than its {self._size}-byte partition")
            for done in range(0, length, _CHUNK):
                piece = min(_CHUNK, length - done)
                data = self._read(run.physical * self.sb.block_size + done, piece)
                output.write_all(fd, data, start + done)
        os.ftruncate(fd, inode.size)

    def link_target(self, inode: _Inode) -> str:
        if inode.size > limits.LINK_TARGET:
            self._corrupt(f"inode {inode.number} is a {inode.size}-byte symbolic link")
        is_fast = inode.size < _INLINE_SIZE and not inode.flags & (_EXTENTS_FL | _INLINE_DATA_FL)
        raw = inode.block[: inode.size] if is_fast else self._content(inode)
        return os.fsdecode(raw.split(b"\0", 1)[0])

    # Directories and paths.

    def _dirents(self, data: bytes) -> Iterator[tuple[bytes, int]]:
        position = 0
        while position + _DIRENT_HEADER <= len(data):
            number, rec_len, name_len, file_type = struct.unpack_from("<IHBB", data, position)
            if not self.sb.incompat & _INCOMPAT_FILETYPE:
                name_len |= file_type << 8
            if rec_len in (0, 0xFFFF) and len(data) == _EXT4_MAX_BLOCK:
                rec_len = _EXT4_MAX_BLOCK
            if rec_len < _DIRENT_HEADER or position + rec_len > len(data):
                self._corrupt("a bad directory entry")
            name = data[position + _DIRENT_HEADER : position + _DIRENT_HEADER + name_len]
            if number and name not in (b"", b".", b".."):
                yield name, number
            position += rec_len

    def entries(self, directory: _Inode) -> Iterator[tuple[bytes, int]]:
        if directory.flags & _INLINE_DATA_FL:
            # The parent's inode number comes first, then entries, continued in system.data.
            yield from self._dirents(directory.block[4:])
            yield from self._dirents(self._inline_data(directory))
            return
        data = self._content(directory)
        for start in range(0, len(data), self.sb.block_size):
            yield from self._dirents(data[start : start + self.sb.block_size])

    def _child(self, directory: _Inode, name: str) -> int | None:
        wanted = os.fsencode(name)
        return next((number for entry, number in self.entries(directory) if entry == wanted), None)

    def resolve(self, path: str) -> tuple[PurePosixPath, _Inode] | None:
        """Look path up as if the filesystem were /, following symlinks but in the last part."""
        pending = [part for part in path.split("/") if part not in ("", ".")]
        resolved: list[tuple[str, _Inode]] = []
        root = self.inode(_EXT4_ROOT_INODE)
        followed = 0
        while pending:
            name = pending.pop(0)
            if name == "..":
                if resolved:
                    resolved.pop()
                continue
            directory = resolved[-1][1] if resolved else root
            number = self._child(directory, name) if directory.kind == stat.S_IFDIR else None
            if number is None:
                return None
            inode = self.inode(number)
            if inode.kind == stat.S_IFLNK and pending:
                followed += 1
                if followed > _MAX_SYMLINKS:
                    self._corrupt(f"too many levels of symbolic links in {path}")
                target = self.link_target(inode)
                if target.startswith("/"):
                    resolved = []
                pending = [p for p in target.split("/") if p not in ("", ".")] + pending
                continue
            resolved.append((name, inode))
        return PurePosixPath(*(name for name, _ in resolved)), resolved[-1][1] if resolved else root

    # Extraction.

    def extract(self, wanted: Iterable[str], destination: Path) -> list[PurePosixPath]:
        """Copy the wanted paths (and all below them) into destination, a new directory.

        Returns the paths found.
        """
        found = []
        for path in wanted:
            resolved = self.resolve(path)
            if resolved is None:
                warn(f"/{path.lstrip('/')} is not in {self.WHAT}; skipped")
            else:
                found.append(resolved)
        destination.mkdir(parents=True, exist_ok=True)
        extraction = _Extraction(output.TreeWriter(destination, self.THROUGH_LINK))
        done: list[PurePosixPath] = []
        # Parents first, so that a path inside another one is found already done.
        for rel, inode in sorted(found, key=lambda item: len(item[0].parts)):
            if any(rel == path or path in rel.parents for path in done):
                continue
            say(f"Extracting /{rel} from {self.WHAT}...")
            self._extract(inode, rel, extraction)
            done.append(rel)
        # Each link was checked as text; through one another (a chain of "..") they may leave.
        output.drop_escaping_links(destination, extraction.writer.symlinks(), self.WHAT)
        return done

    def _extract(self, inode: _Inode, rel: PurePosixPath, extraction: _Extraction) -> None:
        if len(rel.parts) > limits.PATH_DEPTH:
            self._corrupt(f"/{str(rel)[:200]} is more than {limits.PATH_DEPTH} directories deep")
        extraction.entries += 1
        if extraction.entries > limits.EXT4_ENTRIES:
            self._corrupt(f"more than {limits.EXT4_ENTRIES} entries to extract")
        if inode.kind == stat.S_IFDIR:
            self._extract_directory(inode, rel, extraction)
        elif inode.kind == stat.S_IFREG:
            self._extract_file(inode, rel, extraction)
        elif inode.kind == stat.S_IFLNK:
            target = output.contained_link_target(rel, self.link_target(inode))
            if target is None:
                warn(f"/{rel} points outside {self.WHAT}; left out")
            else:
                extraction.writer.symlink(_rel(rel), target, inode.mtime)
        # Devices, fifos and sockets have no place in a build root.

    def _extract_directory(
        self, inode: _Inode, rel: PurePosixPath, extraction: _Extraction
    ) -> None:
        if inode.number in extraction.directories:
            self._corrupt(f"directory inode {inode.number} appears twice")
        extraction.directories.add(inode.number)
        path = extraction.writer.directory(_rel(rel))
        for raw_name, number in self.entries(inode):
            name = os.fsdecode(raw_name)
            if "/" in name or "\0" in name:
                self._corrupt(f"a file name with a slash in /{rel}")
            self._extract(self.inode(number), rel / name, extraction)
        os.chmod(path, inode.mode & 0o777 | 0o700)  # noqa: PTH101 - the writer's string path
        os.utime(path, (inode.mtime, inode.mtime))

    def _extract_file(self, inode: _Inode, rel: PurePosixPath, extraction: _Extraction) -> None:
        earlier = extraction.hardlinks.get(inode.number)
        if earlier is not None:
            extraction.writer.hardlink(_rel(rel), earlier)
            return
        path = extraction.writer.file(
            _rel(rel), inode.mode, inode.mtime, lambda fd: self.copy_to(inode, fd)
        )
        if inode.links > 1:
            extraction.hardlinks[inode.number] = path


def _coalesce(mapped: list[tuple[int, int]]) -> list[_Run]:
    runs: list[_Run] = []
    for logical, physical in sorted(mapped):
        last = runs[-1] if runs else None
        if (
            last
            and last.logical + last.length == logical
            and last.physical + last.length == physical
        ):
            runs[-1] = last._replace(length=last.length + 1)
        else:
            runs.append(_Run(logical, physical, 1))
    return runs


def _rel(path: PurePosixPath) -> str:
    """A relative path as a TreeWriter takes it: "" for the root itself."""
    return "" if path == PurePosixPath() else path.as_posix()
