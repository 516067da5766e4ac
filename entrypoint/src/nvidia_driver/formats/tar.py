"""A gzip-compressed tar stream, read once, forward only.

tarfile spends most of its time per member building a TarInfo (every field decoded, two
checksums summed) and, in stream mode, copying its buffers; a root file system has tens of
thousands of members and most are skipped. This reads what an extraction uses, in the formats
GNU tar and Python write: ustar and its prefix, GNU long names, pax headers (path, linkpath,
size, mtime; others ignored), GNU sparse headers (skipped), octal and base-256 numbers. Like
tarfile's default reading, a zero block or, after the first member, an invalid header ends the
archive; the caller reads the stream to its end, so a corrupt download is then refused by its
checksum.

:class:`Inflated` inflates the gzip stream ahead, on a thread of its own, and stops at a bound:
the caller says how many inflated bytes an archive may hold.

What any tar extraction may write, whichever reader read its members, is judged here too:
:func:`member_path` and :func:`symlink_target` refuse names and links that leave the extraction
root, and a :class:`Budget` refuses a member before it would pass the extraction's bounds.
"""

from __future__ import annotations

import queue
import re
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, NamedTuple

from nvidia_driver import limits
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import output
from nvidia_driver.links import escaping_links

CHUNK = 1 << 20
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate data
_INFLATED_CHUNKS = 32  # inflated ahead of the archive parser, at most CHUNK bytes each
_STOP_POLL_SECONDS = 0.05

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
# name, mode, mtime, typeflag, linkname and ustar's prefix (uid, gid, size, checksum, magic,
# owner names and device numbers are skipped)
_HEADER = struct.Struct("100s8s16x12x12s8xc100s88x155s")
_SIZE, _CHECKSUM, _TYPEFLAG = slice(124, 136), slice(148, 156), slice(156, 157)
REGULAR = frozenset((b"0", b"\0", b"7"))  # file, old-style file, contiguous file
HARDLINK, SYMLINK, DIRECTORY = b"1", b"2", b"5"
_NO_DATA = frozenset((HARDLINK, SYMLINK, b"3", b"4", DIRECTORY, b"6"))
_GNU_LONG_NAME, _GNU_LONG_LINK, _GNU_SPARSE = b"L", b"K", b"S"
_PAX, _PAX_GLOBAL, _SOLARIS_PAX = b"x", b"g", b"X"
_METADATA = frozenset((_GNU_LONG_NAME, _GNU_LONG_LINK, _PAX, _PAX_GLOBAL, _SOLARIS_PAX))
_GNU_SPARSE_EXTENDED = 482  # in a sparse header: more sparse headers follow
_GNU_SPARSE_MORE = 504  # in those
_BASE256, _BASE256_NEGATIVE = 0x80, 0xFF  # GNU's first byte of a binary number field
_HIGH_BIT = 0x80
_PAX_NUMBER = re.compile(r"[0-9]+")
_PAX_TIME = re.compile(r"-?[0-9]{1,12}(\.[0-9]{0,9})?")  # seconds, as pax writes them
_MAX_MTIME = 1 << 40  # beyond that, os.utime overflows; no real file is that old or new
_MAX_PAX_DIGITS = 20


class TarError(DriverError):
    """The stream is not a tar archive this reader reads, or it is corrupt."""


class OverBoundError(DriverError):
    """The archive holds more than its bound: a decompression bomb, or not the archive."""


class InflatedTooLargeError(OverBoundError):
    """The stream inflates to more than its bound: a decompression bomb, or not the archive."""


class UnsafeMemberError(DriverError):
    """A member's name or link would leave the extraction root, or is no path at all."""


class Member(NamedTuple):
    name: str
    kind: bytes  # the header's typeflag
    size: int  # of the data that follows the header
    mode: int
    mtime: float
    linkname: str
    sparse: bool


@dataclass
class _Extended:
    """What GNU long-name and pax headers say about the member that follows them."""

    long_name: str | None = None
    long_link: str | None = None
    pax: dict[str, str] = field(default_factory=dict)
    size: int = 0  # of the extended headers read so far

    def add(self, kind: bytes, content: bytes) -> None:
        self.size += len(content)
        if self.size > limits.TAR_METADATA:
            raise TarError(f"more than {limits.TAR_METADATA} bytes of extended headers")
        if kind == _GNU_LONG_NAME:
            self.long_name = _text(content)
        elif kind == _GNU_LONG_LINK:
            self.long_link = _text(content)
        elif kind != _PAX_GLOBAL:  # a global header holds nothing the extraction uses
            self.pax.update(_pax_records(content))


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _number(field: bytes) -> int:
    if field[0] in (_BASE256, _BASE256_NEGATIVE):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == _BASE256_NEGATIVE else value
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise TarError(f"a header field is not a number: {field!r}") from None


def _checksum_matches(header: bytes) -> bool:
    unsigned = sum(header) - sum(header[_CHECKSUM]) + 8 * 0x20  # the field counts as spaces
    try:
        expected = _number(header[_CHECKSUM])
    except TarError:
        return False
    if expected == unsigned:
        return True
    # Some old tars summed signed bytes.
    high = sum(1 for byte in header[:148] + header[156:] if byte >= _HIGH_BIT)
    return expected == unsigned - 256 * high


def _pax_records(data: bytes) -> dict[str, str]:
    """The "<length> <key>=<value>\\n" records of a pax header."""
    records: dict[str, str] = {}
    position = 0
    while position < len(data) and data[position] != 0:
        space = data.find(b" ", position)
        try:
            length = int(data[position:space])
        except ValueError:
            raise TarError("a malformed pax header") from None
        record = data[space + 1 : position + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise TarError("a malformed pax header")
        key, value = record[:-1].split(b"=", 1)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def _next_header(data: Inflated, first: bool) -> bytes | None:
    """The next member's header block; None at the end of the archive."""
    header = data.read(_BLOCK)
    if header == _ZERO_BLOCK:
        return None
    if len(header) == _BLOCK and _checksum_matches(header):
        return header
    if first:
        raise TarError("not a tar archive")
    return None  # as tarfile: what follows the last valid header is not read


def _read_metadata(data: Inflated, size: int) -> bytes:
    if size > limits.TAR_METADATA:
        raise TarError(f"a {size}-byte extended header")
    content = data.read(size)
    if len(content) < size:
        raise TarError("unexpected end of data")
    data.seek(data.tell() + -size % _BLOCK)
    return content


def _skip_sparse_headers(data: Inflated, header: bytes) -> None:
    extended = header[_GNU_SPARSE_EXTENDED]
    while extended:
        more = data.read(_BLOCK)
        if len(more) < _BLOCK:
            raise TarError("unexpected end of data")
        extended = more[_GNU_SPARSE_MORE]


def _member(header: bytes, size: int, extended: _Extended) -> Member:
    name, mode, mtime, kind, link, prefix = _HEADER.unpack_from(header)
    pax = extended.pax
    path = extended.long_name or pax.get("path")
    if path is None:
        path = _text(name)
        if kind != _GNU_SPARSE and prefix[0]:  # ustar keeps long names' directories apart
            path = f"{_text(prefix)}/{path}"
    if kind == b"\0" and path.endswith("/"):
        kind = DIRECTORY  # how pre-POSIX tars mark a directory
    return Member(
        name=path,
        kind=kind,
        size=0 if kind in _NO_DATA else size,
        mode=_number(mode),
        mtime=_pax_time(pax["mtime"]) if "mtime" in pax else checked_mtime(_number(mtime)),
        linkname=extended.long_link or pax.get("linkpath") or _text(link),
        sparse=kind == _GNU_SPARSE or any(key.startswith("GNU.sparse.") for key in pax),
    )


def checked_mtime(seconds: float) -> float:
    """A member's modification time, refused (TarError) where os.utime would overflow."""
    if not -_MAX_MTIME < seconds < _MAX_MTIME:
        raise TarError(f"an implausible modification time ({seconds:.0f})")
    return seconds


def _pax_time(text: str) -> float:
    if not _PAX_TIME.fullmatch(text):
        raise TarError(f"a pax mtime that is not a time: {text[:40]!r}")
    return checked_mtime(float(text))


def _pax_size(text: str) -> int:
    if not _PAX_NUMBER.fullmatch(text) or len(text) > _MAX_PAX_DIGITS:
        raise TarError(f"a pax size that is not a size: {text[:40]!r}")
    return int(text)


def members(data: Inflated) -> Iterator[Member]:
    """The members of the tar archive in data; each is yielded with data at its contents."""
    extended = _Extended()
    first = True
    while (header := _next_header(data, first)) is not None:
        first = False
        pax_size = extended.pax.get("size")
        size = _pax_size(pax_size) if pax_size is not None else _number(header[_SIZE])
        if size < 0:
            raise TarError(f"a member of negative size at byte {data.tell() - _BLOCK}")
        kind = header[_TYPEFLAG]
        if kind in _METADATA:
            extended.add(kind, _read_metadata(data, size))
            continue
        if kind == _GNU_SPARSE:
            _skip_sparse_headers(data, header)
        member = _member(header, size, extended)
        start = data.tell()
        yield member
        data.seek(start + member.size + -member.size % _BLOCK)
        extended = _Extended()


# --- what an extraction writes --------------------------------------------------------------


def member_path(name: str) -> str:
    """A member's name as a path relative to the extraction root ("" for the root itself).

    Names that are absolute or hold a ".." component are refused, not made relative: no genuine
    archive of a tree has them. So are names with a NUL byte or more than limits.PATH_DEPTH
    components.
    """
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise UnsafeMemberError(
            f"a member that would land outside the extraction directory ({name[:200]!r})"
        )
    if "\0" in name or len(parts) > limits.PATH_DEPTH:
        raise UnsafeMemberError(
            f"a member name with a NUL byte or more than {limits.PATH_DEPTH} components "
            f"({name[:200]!r})"
        )
    return "/".join(parts)


def symlink_target(rel: str, name: str, linkname: str) -> str:
    """What the symbolic link member name, at rel, may point to (output.contained_link_target:
    an absolute target becomes relative); refused if it climbs out, is empty or is too long."""
    if "\0" in linkname or len(linkname) > limits.LINK_TARGET:
        raise UnsafeMemberError(
            f"a symbolic link with a NUL byte or more than {limits.LINK_TARGET} bytes in its "
            f"target ({name[:200]})"
        )
    target = output.contained_link_target(PurePosixPath(rel), linkname)
    if target is None:
        raise UnsafeMemberError(
            f"a symbolic link out of the extraction directory ({name} -> {linkname})"
        )
    return target


def refuse_escaping_links(writer: output.TreeWriter) -> None:
    """Each link was checked as text when written; here all are, by where they resolve (only
    once the archive has its verdict: this follows them)."""
    escaping = escaping_links(writer.root, writer.symlinks())
    if escaping:
        rel = escaping[0]
        raise UnsafeMemberError(
            "a symbolic link that resolves out of the extraction directory "
            f"({rel} -> {Path(writer.path(rel)).readlink()}, through its other links)"
        )


@dataclass
class Budget:
    """The entries and file bytes an extraction may write (bounds from limits.py, taken when
    the extraction starts), counted member by member."""

    max_entries: int  # files, links and directories
    max_written: int  # the bytes of every file
    max_member: int  # the bytes of one file
    entries: int = 0
    written: int = 0

    def take(self, name: str, file_size: int | None) -> None:
        """Count member name (file_size None: not a file); refused before it passes a bound."""
        self.entries += 1
        if self.entries > self.max_entries:
            raise OverBoundError(f"more than {self.max_entries} entries to write")
        if file_size is None:
            return
        if file_size > self.max_member:
            raise OverBoundError(
                f"{name[:200]} of {file_size} bytes, more than the "
                f"{limits.size(self.max_member)} a file may have"
            )
        self.written += file_size
        if self.written > self.max_written:
            raise OverBoundError(f"more than {limits.size(self.max_written)} to write")


class Inflated:
    """The decompressed bytes of a gzip stream, inflated ahead by a thread of its own.

    Reading the download (which hashes it and feeds gpgv) and inflating it release the GIL, so
    they run on a second core while this thread parses the archive and writes the tree: at a
    mirror's bandwidth the extraction then keeps pace with the download. Reading only goes
    forward; skipping drops whole inflated chunks without copying them, and most of a root file
    system's bytes are skipped. Like tarfile's "r|gz", only the first gzip member is read;
    whatever follows it is left to the caller. More than ``limit`` inflated bytes raise
    InflatedTooLargeError where they would be read.
    """

    def __init__(self, stream: BinaryIO, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._queue: queue.Queue[bytes | Exception | None] = queue.Queue(_INFLATED_CHUNKS)
        self._stop = threading.Event()
        self._chunk = b""
        self._offset = 0  # in _chunk
        self._position = 0  # in the inflated stream
        self._ended = False
        self._thread = threading.Thread(target=self._inflate, name="inflate", daemon=True)
        self._thread.start()

    def tell(self) -> int:
        return self._position

    def seek(self, position: int) -> None:
        """Skip forward to position (or to the end, if it comes first)."""
        while self._position < position and self._available():
            step = min(position - self._position, len(self._chunk) - self._offset)
            self._offset += step
            self._position += step

    def read(self, size: int) -> bytes:
        """The next size bytes; fewer only at the end."""
        pieces = []
        while size > 0 and self._available():
            start = self._offset
            self._offset = min(start + size, len(self._chunk))
            whole = start == 0 and self._offset == len(self._chunk)
            pieces.append(self._chunk if whole else self._chunk[start : self._offset])
            size -= self._offset - start
            self._position += self._offset - start
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def write_to(self, fd: int, size: int) -> None:
        """Write the next size bytes to fd."""
        while size > 0:
            if not self._available():
                raise TarError("unexpected end of data")
            start = self._offset
            self._offset = min(start + size, len(self._chunk))
            output.write_all(fd, memoryview(self._chunk)[start : self._offset])
            size -= self._offset - start
            self._position += self._offset - start

    def _available(self) -> bool:
        """Whether there are inflated bytes at the current position (waits for them)."""
        while self._offset >= len(self._chunk):
            if self._ended:
                return False
            item = self._queue.get()
            if item is None or isinstance(item, Exception):
                self._ended = True
                if item is None:
                    return False
                raise item
            self._chunk, self._offset = item, 0
        return True

    def close(self) -> None:
        """Stop inflating; afterwards the stream is the caller's again."""
        self._stop.set()
        self._thread.join()

    def _inflate(self) -> None:
        try:
            inflater = zlib.decompressobj(_GZIP_WBITS)
            total = 0
            while not inflater.eof:
                pending = self._stream.read(CHUNK)
                if not pending:
                    self._put(TarError("the gzip stream ends before its end-of-stream marker"))
                    return
                while pending and not inflater.eof:
                    # Bounded output: a small chunk may hold a long run of zeros.
                    inflated = inflater.decompress(pending, CHUNK)
                    total += len(inflated)
                    if total > self._limit:
                        bound = limits.size(self._limit)
                        self._put(InflatedTooLargeError(f"more than {bound} of data once inflated"))
                        return
                    if inflated and not self._put(inflated):
                        return
                    pending = inflater.unconsumed_tail
            self._put(None)
        except zlib.error as exc:  # not gzip, or corrupt: said as the tar reader says it
            self._put(TarError(str(exc)))
        except Exception as exc:  # noqa: BLE001 - handed over, raised in the reading thread
            self._put(exc)

    def _put(self, item: bytes | Exception | None) -> bool:
        """Queue item unless told to stop; whether to go on."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_STOP_POLL_SECONDS)
            except queue.Full:
                continue
            return True
        return False
