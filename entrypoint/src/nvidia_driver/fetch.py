"""Download Flatcar release artifacts and verify them before anything uses them.

Each artifact ``<url>`` on a Flatcar release server has two companions: ``<url>.DIGESTS``
(sections ``# MD5 HASH``, ``# SHA1 HASH`` and ``# SHA512 HASH`` of ``<hex>  <name>`` lines) and
``<url>.sig`` (a detached OpenPGP signature by Flatcar's image-signing key). An artifact is used
only once its SHA512 matches the DIGESTS file *and* ``gpgv`` accepts its signature against the
keyring: the Flatcar key shipped in ``keys/``, or the one ``FLATCAR_KEYRING`` names.

There are two ways to get an artifact:

* :meth:`Fetcher.fetch` returns a verified file from a content-addressed cache::

      <cache_dir>/sha512/<sha512 hex>   verified artifacts, named by their content
      <cache_dir>/urls/<sha256 of URL>  "<sha512>  <url>": what the URL was verified to hold
      <cache_dir>/.scratch-*/           one download in flight (partial file, signature,
                                        keyring); removed whatever the outcome

  A URL with a record is served without any request: versioned Flatcar release URLs never change
  their content (so do not pass ``current`` URLs). The DIGESTS and signature are therefore not
  cached; the record stands for them. A cached file is re-hashed before use and downloaded again
  if it is damaged.

* :meth:`Fetcher.stream` serves archives too big to land whole on disk: the caller reads a file
  object sequentially while the bytes are hashed and copied to ``gpgv``; the verdict comes when
  the ``with`` block ends, even when the caller fails inside it (a corrupted download is then
  reported as such, not as whatever the caller made of the bad bytes). Nothing is cached.

Network failures (unreachable host, timeouts, HTTP 408/425/429/5xx, a body shorter than its
Content-Length) are retried with exponential backoff. A missing artifact (HTTP 404), a digest
mismatch and a bad signature are not: retrying would not change them.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import http.client
import io
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO, Protocol, TypeVar

from nvidia_driver.commands import Commands, lines
from nvidia_driver.errors import DriverError
from nvidia_driver.log import say, warn

if TYPE_CHECKING:
    import subprocess

    from _typeshed import WriteableBuffer

FLATCAR_KEYRING_ENV = "FLATCAR_KEYRING"
FLATCAR_IMAGE_SIGNING_KEY = Path(__file__).parent / "keys" / "flatcar-image-signing-key.asc"

CHUNK = 1 << 20
# DIGESTS files and signatures are a few hundred bytes; anything bigger is not one.
SMALL_FILE_LIMIT = 1 << 20
SCHEMES = frozenset({"http", "https", "file"})
USER_AGENT = "nvidia-driver-entrypoint (Flatcar GPU driver container)"
NOT_FOUND = frozenset({HTTPStatus.NOT_FOUND, HTTPStatus.GONE})
RETRYABLE = frozenset(
    {HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.TOO_EARLY, HTTPStatus.TOO_MANY_REQUESTS}
)
FIFO_POLL_SECONDS = 0.01

SHA512_HEX_LENGTH = 128
_ARMOR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
_ARMOR_END = "-----END PGP PUBLIC KEY BLOCK-----"
_CRC24_INIT = 0xB704CE
_CRC24_POLY = 0x1864CFB
# gpgv status lines that refuse a signature, most specific first (NO_PUBKEY comes with ERRSIG).
_REFUSALS = (
    ("BADSIG", "BAD signature: the file is not what was signed"),
    ("REVKEYSIG", "signed by a revoked key"),
    ("NO_PUBKEY", "signed by a key that is not in the keyring"),
    ("ERRSIG", "the signature cannot be checked"),
)

_T = TypeVar("_T")


def keyring_from_env(env: Mapping[str, str]) -> Path:
    """The keyring signatures must verify against: ``FLATCAR_KEYRING``, else Flatcar's key."""
    configured = env.get(FLATCAR_KEYRING_ENV, "").strip()
    return Path(configured) if configured else FLATCAR_IMAGE_SIGNING_KEY


@dataclass(frozen=True)
class Backoff:
    """Bounded retries: ``attempts`` tries with exponentially growing pauses in between."""

    attempts: int = 5
    first_delay: float = 2.0
    multiplier: float = 2.0
    max_delay: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")

    def delays(self) -> tuple[float, ...]:
        """The pauses between attempts: one fewer than the attempts."""
        return tuple(
            min(self.first_delay * self.multiplier**retry, self.max_delay)
            for retry in range(self.attempts - 1)
        )


def sha512_from_digests(digests: str, filename: str) -> str | None:
    """The SHA512 that a Flatcar DIGESTS file lists for ``filename``, if it lists one."""
    section = ""
    for raw_line in digests.splitlines():
        line = raw_line.strip()
        if line.startswith("#"):
            section = line.lstrip("#").strip().upper()
            continue
        digest, _, name = line.partition(" ")
        # sha512sum marks binary mode with '*'; names may carry a directory.
        listed = PurePosixPath(name.strip().lstrip("*")).name
        if section == "SHA512 HASH" and listed == filename and _is_sha512(digest):
            return digest.lower()
    return None


def dearmor(text: str) -> bytes:
    """The binary packets of ASCII-armored public key blocks (gpgv 2.2 reads only binary)."""
    packets = b""
    rest = text
    while _ARMOR_BEGIN in rest:
        block, found_end, rest = rest.split(_ARMOR_BEGIN, 1)[1].partition(_ARMOR_END)
        if not found_end:
            raise ValueError("unterminated armored key block")
        packets += _decode_armored_block(block)
    if not packets:
        raise ValueError("no armored public key block")
    return packets


def signature_problem(returncode: int, output: str) -> str | None:
    """Why gpgv's output (with ``--status-fd``) is not a valid signature; None when it is."""
    statuses = {words[1] for words in map(str.split, output.splitlines()) if _is_status(words)}
    for status, reason in _REFUSALS:
        if status in statuses:
            return reason
    # A signature by a subkey that has expired since (EXPKEYSIG) still counts: Flatcar rotates
    # subkeys, and older releases stay signed by the retired ones.
    if returncode == 0 and "VALIDSIG" in statuses:
        return None
    messages = [line.strip() for line in output.splitlines() if not line.startswith("[GNUPG:]")]
    return next((line for line in messages if line), f"gpgv exited with {returncode}")


class _TransientError(Exception):
    """A download failure worth another attempt."""


class _Body(Protocol):
    def read(self, amt: int, /) -> bytes: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Opened:
    """A response whose body is being read, and the length its headers announced."""

    url: str
    body: _Body
    length: int | None

    def read(self, size: int) -> bytes:
        try:
            return self.body.read(size)
        except (OSError, http.client.HTTPException) as exc:
            raise _TransientError(f"download of {self.url} broke off: {exc}") from exc

    def chunks(self) -> Iterator[bytes]:
        while chunk := self.read(CHUNK):
            yield chunk

    def check_complete(self, size: int) -> None:
        """Refuse a body that ended before its Content-Length (the server or link dropped)."""
        if self.length is not None and size < self.length:
            raise _TransientError(
                f"download of {self.url} was truncated: got {size} of {self.length} bytes"
            )

    def close(self) -> None:
        self.body.close()


@dataclass(frozen=True)
class Fetcher:
    """Downloads verified Flatcar artifacts; see the module docstring for the cache layout."""

    cache_dir: Path
    commands: Commands
    keyring: Path = FLATCAR_IMAGE_SIGNING_KEY
    backoff: Backoff = field(default_factory=Backoff)
    sleep: Callable[[float], None] = time.sleep
    timeout: float = 60.0  # seconds without progress on one connection

    def fetch(self, url: str) -> Path:
        """A verified local copy of ``url``; downloaded only when the cache does not hold it."""
        cached = self._cached(url)
        if cached is not None:
            return cached
        expected = self.expected_sha512(url)
        blob = self._blobs / expected
        with self._scratch() as scratch:
            keyring = self._binary_keyring(scratch)  # before any download: fail fast
            signature = self._save(f"{url}.sig", scratch / "signature")
            if _holds(blob, expected):  # another URL (a mirror) brought the same bytes
                self._check_signature(url, scratch, keyring, signature, blob)
            else:
                say(f"Downloading {url}")
                partial = scratch / "artifact"
                _check_digest(url, expected, self._download(url, partial))
                self._check_signature(url, scratch, keyring, signature, partial)
                _publish(partial, blob)
            record = scratch / "record"
            _write_synced(record, f"{expected}  {url}\n".encode())
            _publish(record, self._record(url))
        return blob

    @contextmanager
    def stream(self, url: str) -> Iterator[BinaryIO]:
        """Yield ``url``'s bytes for one sequential read, verified when the block ends.

        On leaving the block, whatever the caller left unread is read too, then DriverError is
        raised unless the bytes matched the DIGESTS file and the signature: the caller stages
        what it makes of the bytes and publishes it only after a clean exit.

        An exception from the block may be the symptom of a bad download (a tar parser on
        corrupted bytes), so the download is still read to its end and checked: if it broke off
        or fails the check, that DriverError is raised, chained from the caller's exception;
        if it is good, the caller's exception goes on unchanged. The caller must have stopped
        reading (joined any thread that reads) by the time its exception leaves the block.
        """
        expected = self.expected_sha512(url)
        with self._scratch() as scratch:
            keyring = self._binary_keyring(scratch)
            signature = self._save(f"{url}.sig", scratch / "signature")
            # gpgv reads the data from a FIFO: the command seam gives it no stdin pipe.
            fifo = scratch / "artifact"
            os.mkfifo(fifo, 0o600)
            gpgv_args = _gpgv_args(keyring, signature, fifo)
            say(f"Streaming {url} (verified when it ends)")
            with (
                closing(self._retrying(lambda: self._open(url))) as opened,
                self.commands.stream("gpgv", gpgv_args, extra_env=_gpgv_env(scratch)) as gpgv,
                _output_closed(gpgv),
            ):
                pipe = _open_fifo_writer(fifo, gpgv)
                if pipe is None:
                    reason = signature_problem(gpgv.wait(), "\n".join(lines(gpgv.stdout)))
                    raise DriverError(f"signature check of {url} failed: {reason}")
                tee = _Tee(opened, _fifo_copier(pipe, url))
                failure: Exception | None = None
                with pipe, tee, io.BufferedReader(tee, CHUNK) as reader:
                    try:
                        yield reader
                    except Exception as exc:  # noqa: BLE001 - raised after the verdict
                        failure = exc
                    _read_to_the_end(url, tee, failure)
                output = "\n".join(lines(gpgv.stdout))
                returncode = gpgv.wait()
            try:
                _check_digest(url, expected, tee.hexdigest())
                self._refuse_bad_signature(url, returncode, output)
            except DriverError as refusal:
                raise refusal from failure
            if failure is not None:
                raise failure  # the download is good: the caller's own error

    @property
    def _blobs(self) -> Path:
        return self.cache_dir / "sha512"

    @property
    def _records(self) -> Path:
        return self.cache_dir / "urls"

    def _record(self, url: str) -> Path:
        return self._records / hashlib.sha256(url.encode()).hexdigest()

    def _cached(self, url: str) -> Path | None:
        record = self._record(url)
        try:
            digest = record.read_text(encoding="utf-8").split(maxsplit=1)[0]
        except (OSError, IndexError):
            return None
        blob = self._blobs / digest
        if _is_sha512(digest) and _holds(blob, digest):
            say(f"Using the verified copy of {url} in {self.cache_dir}")
            return blob
        warn(f"the cached copy of {url} is damaged; downloading it again")
        record.unlink(missing_ok=True)
        if _is_sha512(digest):
            blob.unlink(missing_ok=True)
        return None

    @contextmanager
    def _scratch(self) -> Iterator[Path]:
        try:
            for directory in (self._blobs, self._records):
                directory.mkdir(parents=True, exist_ok=True)
            # In the cache directory, so that finished files are renamed into place atomically.
            scratch = tempfile.TemporaryDirectory(dir=self.cache_dir, prefix=".scratch-")
        except OSError as exc:
            raise DriverError(
                f"cannot use the download cache {self.cache_dir}: {exc.strerror or exc}"
            ) from exc
        with scratch as name:
            yield Path(name)

    def _binary_keyring(self, scratch: Path) -> Path:
        try:
            content = self.keyring.read_bytes()
        except OSError as exc:
            raise DriverError(
                f"cannot read the keyring {self.keyring} ({exc.strerror or exc}); "
                f"point {FLATCAR_KEYRING_ENV} at a keyring or rebuild the image"
            ) from exc
        if _ARMOR_BEGIN.encode() not in content:
            return self.keyring.resolve()  # gpgv takes bare names as relative to its home
        try:
            packets = dearmor(content.decode("ascii"))
        except ValueError as exc:
            raise DriverError(f"the keyring {self.keyring} is not a valid key: {exc}") from exc
        binary = scratch / "keyring.gpg"
        binary.write_bytes(packets)
        return binary

    def expected_sha512(self, url: str) -> str:
        """The SHA512 the release publishes for ``url``, from its DIGESTS file."""
        digests_url = f"{url}.DIGESTS"
        name = _filename(url)
        digests = self._get_small(digests_url).decode("utf-8", errors="replace")
        digest = sha512_from_digests(digests, name)
        if digest is None:
            raise DriverError(
                f"{digests_url} lists no SHA512 for {name}: the release is incomplete "
                "or the URL is wrong"
            )
        return digest

    def _check_signature(
        self, url: str, scratch: Path, keyring: Path, signature: Path, data: Path
    ) -> None:
        result = self.commands.run(
            "gpgv",
            *_gpgv_args(keyring, signature, data),
            check=False,
            extra_env=_gpgv_env(scratch),
        )
        self._refuse_bad_signature(url, result.returncode, result.stdout + result.stderr)

    def _refuse_bad_signature(self, url: str, returncode: int, output: str) -> None:
        problem = signature_problem(returncode, output)
        if problem is not None:
            raise DriverError(
                f"signature check of {url} failed: {problem} (keyring {self.keyring}; "
                f"{FLATCAR_KEYRING_ENV} selects another)"
            )

    def _save(self, url: str, destination: Path) -> Path:
        destination.write_bytes(self._get_small(url))
        return destination

    def _get_small(self, url: str) -> bytes:
        def attempt() -> bytes:
            content = b""
            with closing(self._open(url)) as opened:
                for chunk in opened.chunks():
                    content += chunk
                    if len(content) > SMALL_FILE_LIMIT:
                        raise DriverError(
                            f"{url} is over {SMALL_FILE_LIMIT} bytes: not a DIGESTS or "
                            "signature file; check the URL and any proxy in between"
                        )
                opened.check_complete(len(content))
            return content

        return self._retrying(attempt)

    def _download(self, url: str, destination: Path) -> str:
        """Download ``url`` into ``destination`` (synced to disk); return its SHA512."""

        def attempt() -> str:
            digest = hashlib.sha512()
            size = 0
            with closing(self._open(url)) as opened, destination.open("wb") as file:
                for chunk in opened.chunks():
                    digest.update(chunk)
                    file.write(chunk)
                    size += len(chunk)
                opened.check_complete(size)
                file.flush()
                os.fsync(file.fileno())
            return digest.hexdigest()

        return self._retrying(attempt)

    def _retrying(self, attempt: Callable[[], _T]) -> _T:
        for delay in self.backoff.delays():
            try:
                return attempt()
            except _TransientError as exc:
                warn(f"{exc}; retrying in {delay:g} s")
                self.sleep(delay)
        try:
            return attempt()
        except _TransientError as exc:
            raise DriverError(
                f"{exc} (gave up after {self.backoff.attempts} attempts); "
                "check the node's network, DNS and proxy settings"
            ) from exc

    def _open(self, url: str) -> _Opened:
        if urllib.parse.urlsplit(url).scheme not in SCHEMES:
            raise DriverError(f"cannot download {url}: only http, https and file URLs work")
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})  # noqa: S310 - scheme checked
        try:
            response = urllib.request.urlopen(request, timeout=self.timeout)  # noqa: S310
        except urllib.error.HTTPError as exc:
            exc.close()  # it holds the error page's connection open
            raise _http_failure(url, exc.code, exc.reason) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, FileNotFoundError):  # file:// URLs
                raise _not_found(url, "no such file") from None
            raise _TransientError(f"cannot reach {url}: {exc.reason}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise _TransientError(f"cannot reach {url}: {exc}") from exc
        return _Opened(url, response, _content_length(response.headers.get("Content-Length")))


class _Tee(io.RawIOBase):
    """Reads the download for the caller, hashing each byte and copying it to gpgv."""

    def __init__(self, opened: _Opened, copy: Callable[[bytes], None]) -> None:
        super().__init__()
        self._opened = opened
        self._copy = copy
        self._sha512 = hashlib.sha512()
        self._size = 0
        self.failure: DriverError | None = None  # the first error reading raised, if any

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        view = memoryview(buffer).cast("B")
        chunk = self._take(len(view))
        view[: len(chunk)] = chunk
        return len(chunk)

    def drain(self) -> None:
        """Pass on what the caller left unread: the verdict covers the whole file."""
        while self._take(CHUNK):
            pass

    def hexdigest(self) -> str:
        return self._sha512.hexdigest()

    def _take(self, size: int) -> bytes:
        if self.failure is not None:
            # Not read again: the download is lost, and a timeout would be waited for again.
            raise DriverError(str(self.failure))
        try:
            chunk = self._read(size)
            self._copy(chunk)
        except DriverError as exc:
            self.failure = exc
            raise
        self._sha512.update(chunk)
        self._size += len(chunk)
        return chunk

    def _read(self, size: int) -> bytes:
        try:
            chunk = self._opened.read(size)
            if not chunk:
                self._opened.check_complete(self._size)
        except _TransientError as exc:
            # The caller already consumed the first bytes, so the download cannot start over.
            raise DriverError(f"{exc}; discard what was unpacked and try again") from exc
        return chunk


def _read_to_the_end(url: str, tee: _Tee, failure: Exception | None) -> None:
    """Pass what the caller left unread to the verdict, even after the caller failed.

    A download that breaks off outranks the caller's ``failure``, which it may have caused: its
    DriverError is raised, chained from ``failure`` (unless the caller passed it on unchanged).
    """
    if failure is None:
        tee.drain()
        return
    if tee.failure is not None and failure is tee.failure:
        raise tee.failure  # the caller passed the download's own error on
    if tee.failure is None:
        say(f"Reading {url} stopped on an error; reading the rest to verify the download")
    try:
        tee.drain()
    except DriverError as broken:
        raise broken from failure


def _open_fifo_writer(fifo: Path, reader: subprocess.Popen[str]) -> io.FileIO | None:
    """The FIFO's writing end, once ``reader`` opened it; None if the reader exits first."""
    while reader.poll() is None:
        try:
            # Non-blocking, so that a reader failing before it opens the FIFO cannot hang us.
            descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader has opened it yet
                raise
            time.sleep(FIFO_POLL_SECONDS)
            continue
        os.set_blocking(descriptor, True)
        return io.FileIO(descriptor, "wb")
    return None


@contextmanager
def _output_closed(process: subprocess.Popen[str]) -> Iterator[None]:
    # Commands.stream waits for the process but leaves its output pipe open.
    try:
        yield
    finally:
        if process.stdout is not None:
            process.stdout.close()


def _fifo_copier(pipe: io.FileIO, url: str) -> Callable[[bytes], None]:
    def copy(chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            while view:
                view = view[pipe.write(view) :]
        except BrokenPipeError as exc:
            raise DriverError(
                f"gpgv stopped reading {url} before its end: the signature cannot be checked"
            ) from exc

    return copy


def _gpgv_args(keyring: Path, signature: Path, data: Path) -> Sequence[str]:
    return ["--status-fd", "1", "--keyring", str(keyring), str(signature), str(data)]


def _gpgv_env(scratch: Path) -> dict[str, str]:
    # A private, throw-away home: gpgv never reads or writes the user's ~/.gnupg.
    return {"GNUPGHOME": str(scratch)}


def _http_failure(url: str, code: int, reason: str) -> Exception:
    if code in NOT_FOUND:
        return _not_found(url, f"HTTP {code}")
    if code in RETRYABLE or code >= HTTPStatus.INTERNAL_SERVER_ERROR:
        return _TransientError(f"{url} answered HTTP {code} {reason}")
    return DriverError(f"{url} answered HTTP {code} {reason}; check the URL and any proxy")


def _not_found(url: str, why: str) -> DriverError:
    return DriverError(
        f"{url} does not exist ({why}): no such Flatcar release or artifact; "
        "check the Flatcar version and channel"
    )


def _check_digest(url: str, expected: str, actual: str) -> None:
    if actual != expected:
        raise DriverError(
            f"the SHA512 of {url} ({actual[:16]}...) does not match its DIGESTS file "
            f"({expected[:16]}...): the download is corrupted or truncated; try again"
        )


def _decode_armored_block(block: str) -> bytes:
    # Base64 has no ':' (armor headers do) and '=' only ends a line (the checksum starts one).
    stripped = [line.strip() for line in block.splitlines()]
    body = "".join(line for line in stripped if ":" not in line and not line.startswith("="))
    packets = base64.b64decode(body, validate=True)
    checksums = [line[1:] for line in stripped if line.startswith("=")]
    if checksums and base64.b64decode(checksums[0]) != _crc24(packets).to_bytes(3, "big"):
        raise ValueError("armor checksum mismatch: the key text is damaged")
    return packets


def _crc24(data: bytes) -> int:
    """The OpenPGP armor checksum (RFC 4880, section 6.1)."""
    crc = _CRC24_INIT
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= _CRC24_POLY
    return crc & 0xFFFFFF


def _is_status(words: list[str]) -> bool:
    return len(words) > 1 and words[0] == "[GNUPG:]"


def _is_sha512(text: str) -> bool:
    return len(text) == SHA512_HEX_LENGTH and all(c in "0123456789abcdefABCDEF" for c in text)


def _filename(url: str) -> str:
    return PurePosixPath(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name


def _content_length(header: str | None) -> int | None:
    try:
        length = int(header or "")
    except ValueError:
        return None
    return length if length >= 0 else None


def _holds(path: Path, sha512: str) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha512").hexdigest() == sha512


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("xb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _publish(source: Path, destination: Path) -> None:
    """Rename a finished file into place and make the rename itself durable."""
    source.replace(destination)
    directory = os.open(destination.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
