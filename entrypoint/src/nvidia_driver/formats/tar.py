"""A tar stream read once, forward only, by the standard library's tarfile; what it may write.

tarfile parses the stream (mode ``r|``: ustar, pax, GNU long names, sparse members). What it
does not do is here, once, for every tar extraction (kbuild/container.py, image/runfile.py,
sources/redist.py):

- Bounds on what a stream makes it read and hold. :class:`_Decompressed` hands it at most a
  given count of bytes, decompressing a gzip or xz stream itself (its first member or stream
  only; whatever follows is the caller's; xz within a memory limit), and a member that would end
  past them is refused at once. tarfile reads an extended header (pax, a GNU long name or link,
  a sparse map) whole into memory, and a run of them by recursion: :class:`_BoundedHeaders`
  refuses one before it is read once a member's pass limits.TAR_METADATA or _EXTENDED_HEADERS.
  Global pax headers are not kept.
- Checks of each member: a pax size or mtime that is not a number (tarfile reads those as 0),
  a negative size, a time os.utime cannot set (:meth:`TarStream.members`); a name or link that
  leaves the extraction root (:func:`member_path`, :func:`symlink_target`,
  :func:`refuse_escaping_links`).
- Writing a member through output.TreeWriter (:meth:`TarStream.write`), counted by a
  :class:`Budget` that refuses it before it would pass the extraction's bounds.

Every failure is one DriverError line.
"""

from __future__ import annotations

import io
import lzma
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal, Protocol, Self

from nvidia_driver import limits
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import output
from nvidia_driver.links import escaping_links
from nvidia_driver.safetext import shown

_CHUNK = 1 << 20  # a member's bytes copied at a time; decompressed at most at a time
_COMPRESSED_CHUNK = 1 << 16  # read at a time; most such chunks decompress within _CHUNK
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate data
# Extended headers before one member: GNU tar and Python write at most three (a global pax
# header, then a pax header, or a long name and a long link). tarfile reads such a run by
# recursion, a level each: this keeps it far from the recursion limit.
_EXTENDED_HEADERS = 32
_PAX_NUMBER = re.compile(r"[0-9]{1,20}")
_PAX_TIME = re.compile(r"-?[0-9]{1,12}(\.[0-9]{0,9})?")  # seconds, as pax writes them
_MAX_MTIME = 1 << 40  # beyond that, os.utime overflows; no real file is that old or new
# What reading raises besides tarfile's TarError: its parser on some malformed headers (a GNU
# sparse header cut short, IndexError; a sparse size or map that is not a number, ValueError),
# and the decompressors under it on a stream cut short or corrupt.
_READ_FAILURES = (tarfile.TarError, ValueError, IndexError, EOFError, zlib.error, lzma.LZMAError)


class TarError(DriverError):
    """The stream is not a tar archive this reader reads, or it is corrupt."""


class OverBoundError(DriverError):
    """The archive holds more than its bound: a decompression bomb, or not the archive."""


class UnsafeMemberError(DriverError):
    """A member's name or link would leave the extraction root, or is no path at all."""


# --- reading: tarfile, bounded ----------------------------------------------------------------


class _Gunzip:
    """zlib's decompressor for one gzip member, with the interface of lzma's: the input it has
    not used is kept, and ``needs_input`` says when it wants more."""

    def __init__(self) -> None:
        self._zlib = zlib.decompressobj(_GZIP_WBITS)

    @property
    def eof(self) -> bool:
        return self._zlib.eof

    @property
    def needs_input(self) -> bool:
        return not self._zlib.unconsumed_tail

    def decompress(self, data: bytes, max_length: int) -> bytes:
        return self._zlib.decompress(self._zlib.unconsumed_tail + data, max_length)


Compression = Literal["gzip", "xz"]
_DECOMPRESSORS: dict[Compression, Callable[[], _Gunzip | lzma.LZMADecompressor]] = {
    "gzip": _Gunzip,  # flatcar-container.tar.gz; a gzip .run
    # NVIDIA's redist .tar.xz and an xz .run: within limits.LZMA_MEMORY, as xz --memlimit does.
    "xz": lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ, memlimit=limits.LZMA_MEMORY),
}


class _Decompressed(io.RawIOBase):
    """A tar stream's bytes, at most ``limit`` of them (else OverBoundError, where they would be
    read): the stream's own, or decompressed (its first gzip member or xz stream only)."""

    def __init__(self, stream: IO[bytes], limit: int, compression: Compression | None) -> None:
        super().__init__()
        self._stream = stream
        self._limit = limit
        self._taken = 0
        self._ended = False
        self._compression = compression
        self._decompressor = _DECOMPRESSORS[compression]() if compression else None
        self._chunk = b""  # decompressed, handed over from _offset on
        self._offset = 0

    def read(self, size: int = -1, /) -> bytes:
        wanted = size if size >= 0 else _CHUNK
        if self._decompressor is None:
            # One byte more than the bound allows: what tells a stream at its bound from a bomb.
            data = self._stream.read(min(wanted, self._limit + 1 - self._taken))
        else:
            data = self._decompressed(wanted)
        self._taken += len(data)
        if self._taken > self._limit:
            raise self._over_bound()
        if not data:
            # At the end, tarfile reads once; 3.11's, skipping a member, reads on a block at a
            # time for as long as the member's size says (7 GiB: 700,000 reads). Not twice.
            if self._ended:
                raise TarError("unexpected end of data")
            self._ended = True
        return data

    def reach(self, position: int) -> None:
        """Refuse at once a member that ends past the bound: tarfile would skip to its end a
        block at a time (3.11 also past the end of the stream, for as long as the size says)."""
        if position > self._limit:
            raise self._over_bound()

    def _over_bound(self) -> OverBoundError:
        word = "inflated" if self._compression == "gzip" else "unpacked"
        return OverBoundError(f"more than {limits.size(self._limit)} of data once {word}")

    def _decompressed(self, size: int) -> bytes:
        decompressor = self._decompressor
        assert decompressor is not None
        while self._offset == len(self._chunk):
            if decompressor.eof:
                return b""
            data = b""
            if decompressor.needs_input:
                data = self._stream.read(_COMPRESSED_CHUNK)
                if not data:
                    raise TarError(f"the {self._compression} stream ends before its "
                                   "end-of-stream marker")  # fmt: skip
            try:
                # Bounded output: a small chunk may hold a long run of zeros.
                self._chunk = decompressor.decompress(data, _CHUNK)
            except (zlib.error, lzma.LZMAError) as exc:  # corrupt: said as a corrupt archive is
                raise TarError(str(exc)) from None
            self._offset = 0
        start = self._offset
        self._offset = min(start + size, len(self._chunk))
        return self._chunk[start : self._offset]  # the chunk itself, not a copy, if whole


class _Archive(tarfile.TarFile):
    """tarfile's stream reader, counting the extended headers of the member it reads, keeping
    no list of the members (3.11 keeps every one, in stream mode too)."""

    members: list[tarfile.TarInfo]  # tarfile's, undeclared in its stubs
    extended_headers = 0
    extended_bytes = 0

    def __init__(self, *args: Any, source: _Decompressed, **kwargs: Any) -> None:
        self._source = source  # what tarfile reads, through its own stream wrapper
        super().__init__(*args, **kwargs)

    def next(self) -> tarfile.TarInfo | None:
        self.extended_headers = self.extended_bytes = 0
        member = super().next()
        self.members.clear()
        self._source.reach(self.offset)  # where tarfile reads on: past the member's data
        return member

    def take_extended(self, size: int, *, header: bool = True) -> None:
        """Count an extended header of size bytes (header False: more bytes of a sparse map);
        refused before tarfile reads it if it passes a bound."""
        self.extended_headers += header
        self.extended_bytes += size
        if self.extended_headers > _EXTENDED_HEADERS:
            raise TarError(f"more than {_EXTENDED_HEADERS} extended headers before one member")
        if size > limits.TAR_METADATA:
            raise TarError(f"a {size}-byte extended header")
        if self.extended_bytes > limits.TAR_METADATA:
            raise TarError(f"more than {limits.TAR_METADATA} bytes of extended headers")


class _Unkept(dict[str, str]):
    """Where tarfile keeps the records of global pax headers: nowhere. An extraction uses none
    of them (git archive's comment is the one seen), and tarfile would add every one to every
    later member, a cost per member that a run of global headers makes grow without bound."""

    def __setitem__(self, key: str, value: str) -> None:
        pass


class _BoundedHeaders(tarfile.TarInfo):
    """tarfile's member header, with what it reads before the member bounded (_Archive).

    tarfile reads a pax or GNU long-name header's data whole into memory (a 64 MiB one peaks at
    128 MiB) and a sparse map's blocks into a list: each is counted here before it is read. The
    _proc_* methods overridden are tarfile's private ones, the same from CPython 3.11 (Debian
    12's, which runs the unit tests) to 3.14 (Debian forky's, the images' and the unit tests'
    second run): tests/unit/formats/test_bounds.py fails on either if that changes.
    """

    def _proc_pax(self, archive: _Archive) -> tarfile.TarInfo:
        archive.take_extended(self.size)
        if self.type == tarfile.XGLTYPE:
            archive.pax_headers = _Unkept()
        member: tarfile.TarInfo = super()._proc_pax(archive)  # type: ignore[misc]
        if self.type != tarfile.XGLTYPE:  # this header's records: tarfile reads a word as 0
            _check_pax(member.pax_headers)
        return member

    def _proc_gnulong(self, archive: _Archive) -> tarfile.TarInfo:
        archive.take_extended(self.size)
        return super()._proc_gnulong(archive)  # type: ignore[misc, no-any-return]

    def _proc_sparse(self, archive: _Archive) -> tarfile.TarInfo:
        # An old GNU sparse header: holes beyond its four come in blocks read until the last.
        with _sparse_map(archive):
            return super()._proc_sparse(archive)  # type: ignore[misc, no-any-return]

    def _proc_gnusparse_10(
        self, member: tarfile.TarInfo, pax: dict[str, str], archive: _Archive
    ) -> None:
        # A pax sparse member of GNU's format 1.0: its map, numbers a line, before its data.
        with _sparse_map(archive):
            super()._proc_gnusparse_10(member, pax, archive)  # type: ignore[misc]


def _check_pax(records: Mapping[str, str]) -> None:
    size, mtime = records.get("size"), records.get("mtime")
    if size is not None and not _PAX_NUMBER.fullmatch(size):
        raise TarError(f"a pax size that is not a size: {size[:40]!r}")
    if mtime is not None and not _PAX_TIME.fullmatch(mtime):
        raise TarError(f"a pax mtime that is not a time: {mtime[:40]!r}")


class _Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...
    def tell(self) -> int: ...


class _SparseMap:
    """The archive's stream while tarfile reads a sparse map: the bytes count as a header's."""

    def __init__(self, archive: _Archive, stream: _Readable) -> None:
        self._archive = archive
        self._stream = stream

    def read(self, size: int, /) -> bytes:
        self._archive.take_extended(size, header=False)
        return self._stream.read(size)

    def tell(self) -> int:
        return self._stream.tell()


@contextmanager
def _sparse_map(archive: _Archive) -> Iterator[None]:
    stream = archive.fileobj
    archive.fileobj = _SparseMap(archive, stream)  # type: ignore[assignment]
    try:
        yield
    finally:
        archive.fileobj = stream


def _checked_mtime(seconds: float) -> float:
    """A member's modification time, refused (TarError) where os.utime would overflow."""
    if not -_MAX_MTIME < seconds < _MAX_MTIME:
        raise TarError(f"an implausible modification time ({seconds:.0f})")
    return seconds


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
            f"target ({shown(name)})"
        )
    target = output.contained_link_target(PurePosixPath(rel), linkname)
    if target is None:
        raise UnsafeMemberError(
            f"a symbolic link out of the extraction directory ({shown(name)} -> {shown(linkname)})"
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
            f"({shown(rel)} -> {shown(str(Path(writer.path(rel)).readlink()))}, through its other "
            "links)"
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

    def take(self, member: tarfile.TarInfo) -> None:
        """Count member; refused before it passes a bound."""
        self.entries += 1
        if self.entries > self.max_entries:
            raise OverBoundError(f"more than {self.max_entries} entries to write")
        if not member.isreg():
            return
        if member.size > self.max_member:
            raise OverBoundError(
                f"{shown(member.name)} of {member.size} bytes, more than the "
                f"{limits.size(self.max_member)} a file may have"
            )
        self.written += member.size
        if self.written > self.max_written:
            raise OverBoundError(f"more than {limits.size(self.max_written)} to write")


class TarStream:
    """The members of one tar stream, checked, and what writes them through a TreeWriter."""

    def __init__(self, archive: tarfile.TarFile, budget: Budget) -> None:
        self._archive = archive
        self.budget = budget

    @classmethod
    @contextmanager
    def open(
        cls, stream: IO[bytes], limit: int, budget: Budget, compression: Compression | None
    ) -> Iterator[Self]:
        """The tar stream in stream, at most limit bytes of it (decompressed first if
        compression says so): bounded."""
        data = _Decompressed(stream, limit, compression)
        try:  # tarfile reads the first member here
            # tarfile.open hands keywords it does not know to the class (3.11 to 3.14);
            # typeshed's overloads do not say so.
            archive = _Archive.open(  # type: ignore[call-overload]
                fileobj=data, mode="r|", tarinfo=_BoundedHeaders, encoding="utf-8", source=data
            )
        except tarfile.ReadError as exc:
            raise TarError(f"not a tar archive ({exc})") from exc
        except _READ_FAILURES as exc:
            raise _failure(exc) from exc
        with archive:
            yield cls(archive, budget)

    def members(self) -> Iterator[tarfile.TarInfo]:
        """Each member, its size and time checked; its data is read (write) before the next."""
        while True:
            try:
                member = self._archive.next()
            except _READ_FAILURES as exc:
                raise _failure(exc) from exc
            if member is None:
                return
            if member.size < 0:
                raise TarError(f"a member of negative size ({member.name[:200]!r})")
            _checked_mtime(member.mtime)
            yield member

    def write(
        self,
        writer: output.TreeWriter,
        rel: str,
        member: tarfile.TarInfo,
        mode: int | None,
        source: str | None = None,
    ) -> bool:
        """Write member at rel, counted by the budget: a directory (mode None: as made), a file
        (its data from the stream), a symbolic link (its target checked) or a hard link to
        source, which must be a file this writer wrote. False, nothing written, for anything
        else: a device, a fifo, a hard link to what is not such a file."""
        self.budget.take(member)
        if member.isdir():
            path = writer.directory(rel)
            if mode is not None:
                os.chmod(path, mode)  # noqa: PTH101 - string paths: no Path object per member
        elif member.issym():
            writer.symlink(rel, symlink_target(rel, member.name, member.linkname), member.mtime)
        elif member.islnk():
            if source is None or writer.made(source) != output.FILE:
                return False
            if source != rel:  # GNU tar stores a file archived twice as a link to itself
                writer.hardlink(rel, writer.path(source))
        elif member.isreg():
            writer.file(rel, member.mode if mode is None else mode, member.mtime,
                        lambda fd: self.copy(member, fd))  # fmt: skip
        else:
            return False
        return True

    def copy(self, member: tarfile.TarInfo, fd: int) -> None:
        """Write a regular member's data to fd, read from the stream."""
        data = self._archive.extractfile(member)
        assert data is not None  # tarfile gives every regular member a reader
        while True:
            try:
                chunk = data.read(_CHUNK)
            except _READ_FAILURES as exc:
                raise _failure(exc) from exc
            if not chunk:
                return
            output.write_all(fd, chunk)


def _failure(exc: BaseException) -> TarError:
    if isinstance(exc, tarfile.TarError | EOFError | zlib.error | lzma.LZMAError):
        return TarError(str(exc) or type(exc).__name__)
    return TarError(f"a malformed header ({exc})")  # tarfile's parser's ValueError, IndexError
