"""Unpack NVIDIA's ``NVIDIA-Linux-<arch>-<version>.run`` by parsing it, never by running it.

A driver .run is NVIDIA's makeself 1.6.0-nvN container (docs/nvidia-run-format.md
section 1): a shell stub whose leading lines are ``KEY=value`` (``CRCsum``, ``MD5``, ``skip``, ...),
an embedded fallback decompressor, then one compressed tar stream from line ``skip`` to the end
of the file. The file is ~400 MB, so everything here streams it.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, Protocol

from nvidia_driver import limits
from nvidia_driver.commands import Commands
from nvidia_driver.digests import valid_sha256
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import output, tar
from nvidia_driver.safetext import shown

Compression = tar.Compression | Literal["zstd"]  # zstd: undone by the zstd command

HEADER_SCAN_BYTES = 64 * 1024
CHUNK_BYTES = 1 << 20
# CRCsum and MD5 cover the file from the start of this (1-based) line: lines 2 and 3 hold them.
CHECKSUMMED_FROM_LINE = 4
NO_MD5 = "0" * 32
MAGICS: tuple[tuple[bytes, Compression], ...] = (
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x1f\x8b", "gzip"),
)
# NVIDIA's zstd window size is not documented: allow the largest the zstd CLI can decode.
ZSTD_DECOMPRESS = ("-d", "-c", "-q", "--long=31")
_HEADER_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")
_QUOTED = re.compile(r"([\"'])(.*)\1")


@dataclass(frozen=True)
class RunHeader:
    """The leading ``KEY=value`` lines of a .run, surrounding quotes stripped."""

    fields: dict[str, str]

    @property
    def skip(self) -> int:
        """The 1-based line on which the compressed payload starts."""
        return int(self.fields["skip"])

    @property
    def crc(self) -> int | None:
        value = self.fields.get("CRCsum")
        return int(value) if value else None

    @property
    def md5(self) -> str | None:
        value = self.fields.get("MD5", "").lower()
        return value if value and value != NO_MD5 else None

    @property
    def version(self) -> str | None:
        return self.fields.get("version_string")

    @property
    def target_arch(self) -> str | None:
        """``uname -m`` of the platform the package is for: ``x86_64`` or ``aarch64``."""
        return self.fields.get("TARGET_ARCH")


def read_header(runfile: Path) -> RunHeader:
    """Parse the header by key name: the line order changed across makeself versions."""
    with _open(runfile) as stream:
        head = stream.read(HEADER_SCAN_BYTES)
    lines = head.split(b"\n")
    if len(head) == HEADER_SCAN_BYTES:
        lines.pop()  # possibly cut short
    if lines and lines[0].startswith(b"#!"):
        lines.pop(0)
    fields: dict[str, str] = {}
    # The header ends at the first line that is not KEY=value, so nothing in the stub's
    # body (or the binary that follows) can pose as a header field.
    for raw in lines:
        match = _HEADER_LINE.fullmatch(raw.decode("utf-8", "replace"))
        if match is None:
            break
        fields[match[1]] = _unquote(match[2])
    _check_header(runfile, fields)
    return RunHeader(fields)


def _unquote(value: str) -> str:
    quoted = _QUOTED.fullmatch(value)
    return quoted[2] if quoted else value


def _check_header(runfile: Path, fields: dict[str, str]) -> None:
    if not re.fullmatch(r"[0-9]{1,12}", fields.get("skip", "")) or int(fields["skip"]) < 1:
        raise DriverError(
            f"{runfile} has no valid skip= line in its header: it is not an NVIDIA driver .run "
            "(or it is truncated); download NVIDIA-Linux-<arch>-<version>.run again"
        )
    if fields.get("CRCsum") and not re.fullmatch(r"[0-9]{1,10}", fields["CRCsum"]):
        raise DriverError(f"{runfile} has a malformed CRCsum= header line; download it again")
    if fields.get("MD5") and re.fullmatch(r"[0-9a-fA-F]{32}", fields["MD5"]) is None:
        raise DriverError(f"{runfile} has a malformed MD5= header line; download it again")


def line_offset(runfile: Path, line: int) -> int:
    """Byte offset where 1-based ``line`` starts: just after the ``(line-1)``-th newline."""
    newlines_left = line - 1
    offset = 0
    with _open(runfile) as stream:
        while newlines_left > 0:
            chunk = stream.read(CHUNK_BYTES)
            if not chunk:
                raise DriverError(
                    f"{runfile} ends before line {line}: the file is truncated; download it again"
                )
            index = -1
            while newlines_left > 0:
                index = chunk.find(b"\n", index + 1)
                if index < 0:
                    break
                newlines_left -= 1
            offset += index + 1 if newlines_left == 0 else len(chunk)
    return offset


def payload_offset(runfile: Path, header: RunHeader | None = None) -> int:
    return line_offset(runfile, (header or read_header(runfile)).skip)


def sniff_compression(runfile: Path, offset: int) -> Compression:
    with _open(runfile) as stream:
        stream.seek(offset)
        magic = stream.read(8)
    for prefix, compression in MAGICS:
        if magic.startswith(prefix):
            return compression
    raise DriverError(
        f"{runfile}'s payload at byte {offset} starts with {magic.hex(' ') or 'nothing'}, which "
        "is not zstd, xz or gzip: it is not an NVIDIA driver .run, or it is corrupt"
    )


# --- checksums -------------------------------------------------------------------------------

# POSIX cksum is CRC-32 with the bits in the other order from zlib's CRC-32: feeding zlib the
# bit-reversed bytes and bit-reversing its result gives cksum's CRC at zlib's (C) speed.
_BIT_REVERSED = bytes(int(f"{byte:08b}"[::-1], 2) for byte in range(256))


class PosixCksum:
    """Streaming POSIX ``cksum`` CRC (CRC-32/CKSUM), the value of a .run's ``CRCsum=``."""

    def __init__(self) -> None:
        self._crc = 0xFFFFFFFF  # zlib complements on entry: this is cksum's initial 0
        self._length = 0

    def update(self, data: bytes) -> None:
        self._crc = zlib.crc32(data.translate(_BIT_REVERSED), self._crc)
        self._length += len(data)

    def value(self) -> int:
        # cksum appends the length, least significant byte first, without its zero high bytes.
        length = self._length.to_bytes(8, "little").rstrip(b"\0")
        crc = zlib.crc32(length.translate(_BIT_REVERSED), self._crc)
        return int(f"{crc:032b}"[::-1], 2)


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


@dataclass
class _RangeSums:
    """CRC and MD5 of a file from byte ``start`` to its end, fed chunk by chunk."""

    start: int
    crc: PosixCksum
    md5: _Digest

    @classmethod
    def from_offset(cls, start: int) -> _RangeSums:
        # The format's own checksum, not a security boundary: that is the pinned SHA-256.
        return cls(start, PosixCksum(), hashlib.md5(usedforsecurity=False))

    def feed(self, chunk: bytes, chunk_start: int) -> None:
        skip = self.start - chunk_start
        if skip < len(chunk):
            data = chunk[skip:] if skip > 0 else chunk
            self.crc.update(data)
            self.md5.update(data)

    def matches(self, header: RunHeader) -> bool:
        crc_ok = header.crc is None or self.crc.value() == header.crc
        md5_ok = header.md5 is None or self.md5.hexdigest() == header.md5
        return crc_ok and md5_ok


def verify(runfile: Path, header: RunHeader, offset: int, sha256: str | None = None) -> None:
    """Check the pinned whole-file SHA-256 (if given) and the header's CRC and MD5 (if present).

    One pass over the file computes every sum. The CRC/MD5 range "line 4 to EOF" is verified
    for makeself nv2; for later nvN it is inferred, so a match over the payload alone (what the
    reference says to try before calling a file corrupt) is accepted too.
    """
    expected_sha256 = _pinned_sha256(sha256) if sha256 is not None else None
    whole = hashlib.sha256()
    ranges = [
        _RangeSums.from_offset(line_offset(runfile, CHECKSUMMED_FROM_LINE)),
        _RangeSums.from_offset(offset),
    ]
    position = 0
    with _open(runfile) as stream:
        while chunk := stream.read(CHUNK_BYTES):
            whole.update(chunk)
            for sums in ranges:
                sums.feed(chunk, position)
            position += len(chunk)
    if expected_sha256 is not None and whole.hexdigest() != expected_sha256:
        raise DriverError(
            f"{runfile} has SHA-256 {whole.hexdigest()}, not the pinned {expected_sha256}: the "
            "download is corrupt or a different release; fetch it again or fix the pinned checksum"
        )
    if not any(sums.matches(header) for sums in ranges):
        raise DriverError(_checksum_mismatch(runfile, header, ranges[0]))


def _pinned_sha256(value: str) -> str:
    try:
        return valid_sha256(value, "the pinned checksum")
    except DriverError as exc:
        raise DriverError(f"{exc}; fix the pin") from None


def _checksum_mismatch(runfile: Path, header: RunHeader, sums: _RangeSums) -> str:
    if header.crc is not None and sums.crc.value() != header.crc:
        found = f"its CRC is {sums.crc.value()} but its header says {header.crc}"
    else:
        found = f"its MD5 is {sums.md5.hexdigest()} but its header says {header.md5}"
    return f"{runfile} is corrupt: {found}; download it again"


# --- extraction ------------------------------------------------------------------------------


def extract(
    runfile: Path, dest: Path, *, commands: Commands | None = None, sha256: str | None = None
) -> Path:
    """Verify ``runfile`` and unpack its tree into ``dest`` (new or empty); return ``dest``.

    The members are walked here and written through formats/output.py's TreeWriter, never
    through a link. Refused, as Python's "data" extraction filter refuses them: absolute names,
    names or links leading outside ``dest`` and device files; also names with "..", and what
    passes limits.py's RUN_* bounds. Setuid bits and group and other write are dropped, as the
    filter drops them (install modes come from the .manifest).
    """
    header = read_header(runfile)
    offset = payload_offset(runfile, header)
    verify(runfile, header, offset, sha256)
    compression = sniff_compression(runfile, offset)
    try:
        dest.mkdir(parents=True, exist_ok=True)
        occupied = any(dest.iterdir())
    except OSError as exc:
        raise DriverError(f"cannot unpack {runfile.name} into {dest}: {exc.strerror}") from exc
    if occupied:
        raise DriverError(f"cannot unpack {runfile.name} into {dest}: the directory is not empty")
    try:
        with _payload(runfile, offset, compression, commands or Commands()) as payload:
            _untar(*payload, dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


@contextmanager
def _payload(
    runfile: Path, offset: int, compression: Compression, commands: Commands
) -> Iterator[tuple[IO[bytes], tar.Compression | None]]:
    """The payload's stream, and the compression formats/tar.py undoes while it reads."""
    with _open(runfile) as raw:
        raw.seek(offset)
        if compression != "zstd":
            yield raw, compression
            return
        # zstd is not in this Python's standard library: the zstd command reads the open file
        # from the payload offset.
        with commands.pipe_bytes("zstd", ZSTD_DECOMPRESS, raw) as decompressed:
            yield decompressed, None


_NOT_GENUINE = "it is not a genuine NVIDIA .run"


def _untar(payload: IO[bytes], compression: tar.Compression | None, dest: Path) -> None:
    writer = output.TreeWriter(dest, _NOT_GENUINE)
    budget = tar.Budget(limits.RUN_ENTRIES, limits.RUN_WRITTEN, limits.RUN_MEMBER)
    try:
        # Read by tarfile in stream mode (formats/tar.py); written only by the TreeWriter.
        with tar.TarStream.open(payload, limits.RUN_INFLATED, budget, compression) as archive:
            for member in archive.members():
                _unpack(archive, member, writer)
        # Verified before it was unpacked: the links may be followed now.
        tar.refuse_escaping_links(writer)
    except (tar.UnsafeMemberError, tar.OverBoundError) as exc:
        raise DriverError(
            f"refusing to unpack the driver package: it has {exc}; {_NOT_GENUINE}"
        ) from exc
    except (tar.TarError, OSError) as exc:
        raise DriverError(f"unpacking the driver package failed: {exc}") from exc


def _unpack(archive: tar.TarStream, member: tarfile.TarInfo, writer: output.TreeWriter) -> None:
    """Write one member as the "data" filter would let it be extracted, or refuse it."""
    rel = tar.member_path(member.name)
    if (member.issym() or member.islnk()) and member.linkname.startswith("/"):
        raise tar.UnsafeMemberError(
            f"a link to an absolute path ({shown(member.name)} -> {shown(member.linkname)})"
        )
    source = tar.member_path(member.linkname) if member.islnk() else None
    # The filter keeps no directory mode either.
    mode = None if member.isdir() else _data_mode(member.mode)
    if archive.write(writer, rel, member, mode, source):
        return
    if member.islnk():
        raise tar.UnsafeMemberError(
            f"a hard link to what it has not unpacked as a file before "
            f"({shown(member.name)} -> {shown(member.linkname)})"
        )
    raise tar.UnsafeMemberError(f"a device, fifo or other special file ({shown(member.name)})")


def _data_mode(mode: int) -> int:
    """The mode the "data" filter gives a file: no setuid, setgid, sticky or group and other
    write; no execute for anyone unless for the owner; always readable and writable by it."""
    mode &= 0o755
    if not mode & stat.S_IXUSR:
        mode &= ~0o111
    return mode | stat.S_IRUSR | stat.S_IWUSR


@contextmanager
def _open(runfile: Path) -> Iterator[IO[bytes]]:
    try:
        stream = runfile.open("rb")
    except OSError as exc:
        raise DriverError(f"cannot read {runfile}: {exc.strerror}") from exc
    with stream:
        yield stream
