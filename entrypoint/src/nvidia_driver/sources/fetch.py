"""Download Flatcar release artifacts and verify them before anything uses them.

Each artifact ``<url>`` on a Flatcar release server has two companions: ``<url>.DIGESTS``
(sections ``# MD5 HASH``, ``# SHA1 HASH`` and ``# SHA512 HASH`` of ``<hex>  <name>`` lines) and
``<url>.sig`` (a detached OpenPGP signature by Flatcar's image-signing key). An artifact is used
only once its SHA512 matches the DIGESTS file *and* ``gpgv`` accepts its signature against the
keyring: the Flatcar key shipped in ``keys/`` (refreshed from flatcar.org when Flatcar rotates
its signing subkey), or the one ``FLATCAR_KEYRING`` names; see ``verify.py``.

There are two ways to get an artifact:

* :meth:`Fetcher.fetch` returns a verified file from a content-addressed cache::

      <cache_dir>/sha512/<sha512 hex>   verified artifacts, named by their content
      <cache_dir>/urls/<sha256 of URL>  "<sha512>  <url>": what the URL was verified to hold
      <cache_dir>/keys/                 Flatcar's signing key, refreshed (verify.py)
      <cache_dir>/.scratch-*/           one download in flight (partial file, signature,
                                        keyring); removed whatever the outcome

  A URL with a record is served without any request: versioned Flatcar release URLs never change
  their content (so do not pass ``current`` URLs). The DIGESTS and signature are therefore not
  cached; the record stands for them. A cached file is re-hashed before use and downloaded again
  if it is damaged.

* :meth:`Fetcher.stream` serves archives too big to land whole on disk, hashed and copied to
  ``gpgv`` as the caller reads them, verified when the ``with`` block ends. Nothing is cached.

Downloads are bounded and retried as ``download.py`` says; a digest mismatch and a bad signature
are not retried: retrying would not change them. A signal (SIGTERM from the kubelet) ends a
download at once: nothing is drained, nothing is cached, and the caller's cleanup runs.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from nvidia_driver.atomic import sync_directory, write_atomically
from nvidia_driver.commands import Commands, lines
from nvidia_driver.errors import DriverError
from nvidia_driver.log import say, warn
from nvidia_driver.sources.download import CHUNK, Downloader, Opened, TransientError
from nvidia_driver.sources.openpgp import gpgv_args, gpgv_env
from nvidia_driver.sources.verify import SignatureCheck, Trust

if TYPE_CHECKING:
    import subprocess

    from _typeshed import WriteableBuffer

# DIGESTS files and signatures are a few hundred bytes; anything bigger is not one.
SMALL_FILE_LIMIT = 1 << 20
FIFO_POLL_SECONDS = 0.01
SHA512_HEX_LENGTH = 128
BLOBS, RECORDS = "sha512", "urls"  # in the cache directory: see the module docstring


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


@dataclass
class Fetcher:
    """Downloads verified Flatcar artifacts; see the module docstring for the cache layout."""

    cache_dir: Path
    commands: Commands
    trust: Trust = field(default_factory=Trust)
    downloader: Downloader = field(default_factory=Downloader)
    signatures: SignatureCheck = field(init=False)

    def __post_init__(self) -> None:
        self.signatures = SignatureCheck(self.commands, self.trust, self.cache_dir, self.downloader)

    def fetch(self, url: str) -> Path:
        """A verified local copy of ``url``; downloaded only when the cache does not hold it."""
        cached = self._cached(url)
        if cached is not None:
            return cached
        expected = self.expected_sha512(url)
        blob = self.cache_dir / BLOBS / expected
        with self._scratch() as scratch:
            signature, keyrings = self._signature(url, scratch)
            if _holds(blob, expected):  # another URL (a mirror) brought the same bytes
                self._check_signature(url, scratch, keyrings, signature, blob)
            else:
                say(f"Downloading {url}")
                partial = scratch / "artifact"
                _check_digest(url, expected, self._download(url, partial))
                self._check_signature(url, scratch, keyrings, signature, partial)
                _publish(partial, blob)
            write_atomically(self._record(url), f"{expected}  {url}\n")
        return blob

    def forget(self, url: str) -> None:
        """Drop what the cache recorded for ``url`` (its bytes turned out wrong for it)."""
        self._record(url).unlink(missing_ok=True)

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

        A signal (CaughtSignalError, a BaseException) is not such an error: it leaves at once,
        without reading the rest, and nothing is verified or kept.
        """
        expected = self.expected_sha512(url)
        with self._scratch() as scratch:
            signature, keyrings = self._signature(url, scratch)
            # gpgv reads the data from a FIFO: the command seam gives it no stdin pipe.
            fifo = scratch / "artifact"
            os.mkfifo(fifo, 0o600)
            arguments = gpgv_args(keyrings, signature, fifo)
            say(f"Streaming {url} (verified when it ends)")
            with (
                closing(self.downloader.open(url)) as opened,
                self.commands.stream("gpgv", arguments, extra_env=gpgv_env(scratch)) as gpgv,
                _output_closed(gpgv),
            ):
                pipe = _open_fifo_writer(fifo, gpgv)
                if pipe is None:
                    output = "\n".join(lines(gpgv.stdout))
                    self.signatures.check(url, gpgv.wait(), output, scratch)
                    raise DriverError(f"signature check of {url} failed: gpgv exited early")
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
                self.signatures.check(url, returncode, output, scratch)
            except DriverError as refusal:
                raise refusal from failure
            if failure is not None:
                raise failure  # the download is good: the caller's own error

    def _record(self, url: str) -> Path:
        return self.cache_dir / RECORDS / hashlib.sha256(url.encode()).hexdigest()

    def _cached(self, url: str) -> Path | None:
        record = self._record(url)
        try:
            digest = record.read_text(encoding="utf-8").split(maxsplit=1)[0]
        except (OSError, IndexError):
            return None
        blob = self.cache_dir / BLOBS / digest
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
            for directory in (BLOBS, RECORDS):
                (self.cache_dir / directory).mkdir(parents=True, exist_ok=True)
            # In the cache directory, so that finished files are renamed into place atomically.
            scratch = tempfile.TemporaryDirectory(dir=self.cache_dir, prefix=".scratch-")
        except OSError as exc:
            raise DriverError(
                f"cannot use the download cache {self.cache_dir}: {exc.strerror or exc}"
            ) from exc
        with scratch as name:
            yield Path(name)

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
        self, url: str, scratch: Path, keyrings: Sequence[Path], signature: Path, data: Path
    ) -> None:
        result = self.commands.run(
            "gpgv",
            *gpgv_args(keyrings, signature, data),
            check=False,
            extra_env=gpgv_env(scratch),
        )
        self.signatures.check(url, result.returncode, result.stdout + result.stderr, scratch)

    def _signature(self, url: str, scratch: Path) -> tuple[Path, list[Path]]:
        """``url``'s signature, and the keyrings to check it with."""
        self.signatures.keyrings(scratch)  # before any download: fail fast
        signature = scratch / "signature"
        signature.write_bytes(self._get_small(f"{url}.sig"))
        return signature, self.signatures.prepare(url, signature, scratch)

    def _get_small(self, url: str) -> bytes:
        return self.downloader.get_small(url, SMALL_FILE_LIMIT, "a DIGESTS or signature file")

    def _download(self, url: str, destination: Path) -> str:
        """Download ``url`` into ``destination`` (synced to disk); return its SHA512."""
        return self.downloader.transfer(
            url, lambda opened: opened.save_to(destination, hashlib.sha512(), sync=True)
        )


class _Tee(io.RawIOBase):
    """Reads the download for the caller, hashing each byte and copying it to gpgv."""

    def __init__(self, opened: Opened, copy: Callable[[bytes], None]) -> None:
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
        except TransientError as exc:
            # The caller already consumed the first bytes, so the download cannot start over.
            raise DriverError(f"{exc}; discard what was unpacked and try again") from exc
        return chunk


def _read_to_the_end(url: str, tee: _Tee, failure: Exception | None) -> None:
    """Pass what the caller left unread to the verdict, even after the caller ``failure``,
    which a download that breaks off outranks (see :meth:`Fetcher.stream`)."""
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


def _check_digest(url: str, expected: str, actual: str) -> None:
    if actual != expected:
        raise DriverError(
            f"the SHA512 of {url} ({actual[:16]}...) does not match its DIGESTS file "
            f"({expected[:16]}...): the download is corrupted or truncated; try again"
        )


def _is_sha512(text: str) -> bool:
    return len(text) == SHA512_HEX_LENGTH and all(c in "0123456789abcdefABCDEF" for c in text)


def _filename(url: str) -> str:
    return PurePosixPath(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name


def _holds(path: Path, sha512: str) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha512").hexdigest() == sha512


def _publish(source: Path, destination: Path) -> None:
    """Rename a finished file into place and make the rename itself durable."""
    source.replace(destination)
    sync_directory(destination.parent)
