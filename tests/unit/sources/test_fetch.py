"""Downloading Flatcar artifacts: verified by DIGESTS and signature, cached, retried, streamed."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import signal
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, NoReturn

import pytest
from fetch_gpg import Keys, publish, release_keys
from fetch_server import ReleaseServer, flatcar_digests

from nvidia_driver.commands import Commands
from nvidia_driver.errors import CaughtSignalError, DriverError
from nvidia_driver.kbuild.container import extract_container_tree
from nvidia_driver.node.signals import signals_raise
from nvidia_driver.sources.download import Backoff, Downloader, DownloadLimits
from nvidia_driver.sources.fetch import Fetcher, sha512_from_digests
from nvidia_driver.sources.openpgp import dearmor, verdict
from nvidia_driver.sources.signingkey import FLATCAR_KEY_URL, FLATCAR_PRIMARY
from nvidia_driver.sources.signingkey import SHIPPED_KEY as FLATCAR_IMAGE_SIGNING_KEY
from nvidia_driver.sources.verify import Trust

RELEASE = "amd64-usr/4593.2.5"
ARTIFACT = f"{RELEASE}/flatcar_production_image.vmlinuz"
ARCHIVE = f"{RELEASE}/flatcar-container.tar.gz"
CONTENT = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and a bit: more than one read chunk
BACKOFF = Backoff(attempts=3, first_delay=0.25, multiplier=2.0)

OTHER_KEY = "signed by a key that is not in the keyring"
TRUNCATED = r"truncated: .*discard what was unpacked"

FLATCAR_DOCUMENTED_SUBKEY = "858A560F97C9AEB22EC1C732961DDDD5250D4A42"
FLATCAR_NEWEST_SUBKEY = "52F145DFD00BBDCD928CBB5A32DA80F91EF52974"


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keys]:
    with release_keys(tmp_path_factory.mktemp("gpg")) as made:
        yield made


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ReleaseServer]:
    with ReleaseServer(tmp_path / "release") as release_server:
        yield release_server


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def fetcher(cache: Path, keys: Keys, sleeps: list[float]) -> Fetcher:
    return make_fetcher(cache, keys.armored, sleeps)


def make_fetcher(
    cache: Path,
    keyring: Path,
    sleeps: list[float],
    trust: Trust | None = None,
    timeout: float = 10,
) -> Fetcher:
    # sleep=sleeps.append: the backoff is recorded, not waited for.
    downloader = Downloader(DownloadLimits(timeout=timeout), BACKOFF, sleep=sleeps.append)
    return Fetcher(cache, Commands(), trust or Trust.of_keyring(keyring), downloader)


def corrupt(content: bytes) -> bytes:
    """The same length, one byte changed: only the digest can tell."""
    return content[:-1] + bytes([content[-1] ^ 0xFF])


def tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(content)
            archive.addfile(member, io.BytesIO(content))
    return buffer.getvalue()


def leftovers(cache: Path) -> list[str]:
    """Everything in the cache but its two (possibly empty) directories."""
    skeleton = {cache / "sha512", cache / "urls"}
    return sorted(str(path.relative_to(cache)) for path in cache.rglob("*") if path not in skeleton)


def sha512(content: bytes) -> str:
    return hashlib.sha512(content).hexdigest()


# --- pure helpers ---------------------------------------------------------------------------


def test_sha512_from_digests_reads_the_sha512_section_of_flatcar_digests() -> None:
    digests = flatcar_digests("flatcar-container.tar.gz", b"rootfs") + flatcar_digests(
        "flatcar_production_image.vmlinuz", b"kernel"
    )

    assert sha512_from_digests(digests, "flatcar-container.tar.gz") == sha512(b"rootfs")
    assert sha512_from_digests(digests, "flatcar_production_image.vmlinuz") == sha512(b"kernel")
    assert sha512_from_digests(digests, "version.txt") is None


def test_sha512_from_digests_ignores_md5_and_sha1_lines() -> None:
    md5_only = f"# MD5 HASH\n{hashlib.md5(b'x').hexdigest()}  a.bin\n"  # noqa: S324 (as Flatcar)

    assert sha512_from_digests(md5_only, "a.bin") is None


def test_sha512_from_digests_accepts_binary_marks_and_directories() -> None:
    digests = f"# SHA512 HASH\n{sha512(b'x').upper()} *build/images/a.bin\n"

    assert sha512_from_digests(digests, "a.bin") == sha512(b"x")


def test_backoff_grows_exponentially_up_to_its_cap() -> None:
    backoff = Backoff(attempts=6, first_delay=1.0, multiplier=3.0, max_delay=20.0)

    assert backoff.delays() == (1.0, 3.0, 9.0, 20.0, 20.0)
    assert Backoff(attempts=1).delays() == ()


def test_backoff_needs_at_least_one_attempt() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Backoff(attempts=0)


def test_the_keyring_defaults_to_the_shipped_flatcar_key_pinned_and_refreshed() -> None:
    flatcar = Trust(FLATCAR_IMAGE_SIGNING_KEY, FLATCAR_PRIMARY, FLATCAR_KEY_URL)
    assert Trust.from_env({}) == flatcar
    assert Trust.from_env({"FLATCAR_KEYRING": " "}) == flatcar
    mirror = "https://mirror.example.internal/Flatcar_Image_Signing_Key.asc"
    assert Trust.from_env({"FLATCAR_SIGNING_KEY_URL": mirror}).key_url == mirror
    assert Trust.from_env({"FLATCAR_SIGNING_KEY_URL": "none"}).key_url is None


def test_a_keyring_of_ones_own_is_neither_pinned_nor_refreshed() -> None:
    own = Trust.from_env({"FLATCAR_KEYRING": "/etc/test.gpg", "FLATCAR_SIGNING_KEY_URL": "x"})
    assert own == Trust(Path("/etc/test.gpg"), None, None)


@pytest.mark.parametrize(
    ("returncode", "output", "problem"),
    [
        (0, "[GNUPG:] GOODSIG 0A Flatcar\n[GNUPG:] VALIDSIG 0A 2026-01-01", None),
        # Signed by a subkey that has expired since: Flatcar's older releases look like this.
        (0, "[GNUPG:] KEYEXPIRED 1\n[GNUPG:] EXPKEYSIG 0A Flatcar\n[GNUPG:] VALIDSIG 0A", None),
        (1, "[GNUPG:] BADSIG 0A Flatcar\ngpgv: BAD signature", "BAD signature"),
        (0, "[GNUPG:] REVKEYSIG 0A Flatcar\n[GNUPG:] VALIDSIG 0A", "revoked"),
        (2, "[GNUPG:] ERRSIG 0A 22\n[GNUPG:] NO_PUBKEY 0A", "not in the keyring"),
        (2, "gpgv: keyblock resource '/k': No such file", "gpgv: keyblock resource"),
        (0, "", "gpgv exited with 0"),
    ],
)
def test_signature_problem_reads_gpgv_status_lines(
    returncode: int, output: str, problem: str | None
) -> None:
    found = verdict(returncode, output).problem

    assert found == problem if problem is None else problem in (found or "")


# --- the shipped key ------------------------------------------------------------------------


def test_shipped_key_is_flatcars_image_signing_key(keys: Keys, tmp_path: Path) -> None:
    show_keys = ["gpg", "--homedir", str(tmp_path), "--batch", "--with-colons", "--show-keys"]
    listing = subprocess.run(
        [*show_keys, "--with-subkey-fingerprints", str(FLATCAR_IMAGE_SIGNING_KEY)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    fingerprints = [line.split(":")[9] for line in listing.splitlines() if line[:4] == "fpr:"]

    assert fingerprints[0] == FLATCAR_PRIMARY
    assert {FLATCAR_DOCUMENTED_SUBKEY, FLATCAR_NEWEST_SUBKEY} <= set(fingerprints)


def test_dearmor_matches_gpg_dearmor(keys: Keys, tmp_path: Path) -> None:
    binary = tmp_path / "flatcar.gpg"
    dearmor_with_gpg = ["gpg", "--homedir", str(tmp_path), "--batch", "--dearmor"]
    subprocess.run(
        [*dearmor_with_gpg, "--output", str(binary), str(FLATCAR_IMAGE_SIGNING_KEY)], check=True
    )

    assert dearmor(FLATCAR_IMAGE_SIGNING_KEY.read_text()) == binary.read_bytes()


def test_dearmor_rejects_damaged_key_text() -> None:
    text = FLATCAR_IMAGE_SIGNING_KEY.read_text()
    damaged = text.replace("mQINBFqUFawBEACdnSVB", "mQINBFqUFawBEACdnSVC", 1)

    with pytest.raises(ValueError, match="checksum"):
        dearmor(damaged)
    with pytest.raises(ValueError, match="no armored"):
        dearmor("not a key")


# --- file mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("armor", [True, False], ids=["armored-keyring", "binary-keyring"])
def test_fetch_returns_the_verified_file_from_a_content_addressed_cache(
    server: ReleaseServer, cache: Path, keys: Keys, sleeps: list[float], armor: bool
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    fetcher = make_fetcher(cache, keys.armored if armor else keys.binary, sleeps)

    path = fetcher.fetch(server.url(ARTIFACT))

    assert path == cache / "sha512" / sha512(CONTENT)
    assert path.read_bytes() == CONTENT
    assert [name.split("/")[0] for name in leftovers(cache)] == ["sha512", "urls"]
    assert sleeps == []


def test_fetch_from_a_warm_cache_sends_no_request(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher, sleeps: list[float]
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    first = fetcher.fetch(server.url(ARTIFACT))
    requests_after_first = sum(server.requests.values())

    again = make_fetcher(cache, keys.armored, sleeps).fetch(server.url(ARTIFACT))

    assert again == first
    assert sum(server.requests.values()) == requests_after_first == 3  # DIGESTS, sig, artifact


def test_fetch_downloads_again_when_the_cached_file_is_damaged(
    server: ReleaseServer, keys: Keys, fetcher: Fetcher
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    path = fetcher.fetch(server.url(ARTIFACT))
    path.write_bytes(b"bit rot")

    assert fetcher.fetch(server.url(ARTIFACT)).read_bytes() == CONTENT
    assert server.requests[f"/{ARTIFACT}"] == 2


def test_fetch_reuses_bytes_another_url_brought_after_checking_the_signature(
    server: ReleaseServer, keys: Keys, fetcher: Fetcher
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    publish(server.root, f"mirror/{ARTIFACT}", CONTENT, keys.trusted)
    fetcher.fetch(server.url(ARTIFACT))

    path = fetcher.fetch(server.url(f"mirror/{ARTIFACT}"))

    assert path.read_bytes() == CONTENT
    assert server.requests[f"/mirror/{ARTIFACT}.sig"] == 1
    assert server.requests[f"/mirror/{ARTIFACT}"] == 0


def test_fetch_reads_file_urls(tmp_path: Path, cache: Path, keys: Keys, fetcher: Fetcher) -> None:
    artifact = publish(tmp_path / "mirror", ARTIFACT, CONTENT, keys.trusted)

    assert fetcher.fetch(artifact.as_uri()).read_bytes() == CONTENT


def test_fetch_refuses_a_corrupted_download_and_keeps_nothing(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher
) -> None:
    artifact = publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    artifact.write_bytes(corrupt(CONTENT))

    with pytest.raises(DriverError, match=r"SHA512 of .* does not match its DIGESTS file"):
        fetcher.fetch(server.url(ARTIFACT))
    assert leftovers(cache) == []


def test_fetch_retries_a_truncated_download_then_gives_up_and_keeps_nothing(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher, sleeps: list[float]
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    server.truncated.add(f"/{ARTIFACT}")

    with pytest.raises(DriverError) as raised:
        fetcher.fetch(server.url(ARTIFACT))

    message = str(raised.value)
    assert f"truncated: got {len(CONTENT) // 2} of {len(CONTENT)} bytes" in message
    assert "gave up after 3 attempts" in message
    assert "\n" not in message
    assert server.requests[f"/{ARTIFACT}"] == 3
    assert sleeps == [0.25, 0.5]
    assert leftovers(cache) == []


def test_fetch_refuses_a_tampered_file_whose_digests_were_rewritten(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher
) -> None:
    artifact = publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    artifact.write_bytes(b"tampered")
    artifact.with_name(f"{artifact.name}.DIGESTS").write_text(
        flatcar_digests(artifact.name, b"tampered")
    )

    with pytest.raises(DriverError, match="BAD signature"):
        fetcher.fetch(server.url(ARTIFACT))
    assert leftovers(cache) == []


def test_fetch_reports_an_unknown_release_without_retrying(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher, sleeps: list[float]
) -> None:
    url = server.url("amd64-usr/9999.9.9/flatcar_production_image.vmlinuz")

    with pytest.raises(DriverError) as raised:
        fetcher.fetch(url)

    message = str(raised.value)
    assert f"{url}.DIGESTS does not exist (HTTP 404)" in message
    assert "check the Flatcar version" in message
    assert sum(server.requests.values()) == 1
    assert sleeps == []
    assert leftovers(cache) == []


def test_fetch_gives_up_on_an_unreachable_server(
    cache: Path, fetcher: Fetcher, sleeps: list[float]
) -> None:
    with socket.socket() as probe:  # a port nobody listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/{ARTIFACT}"

    with pytest.raises(DriverError, match=r"cannot reach .* \(gave up after 3 attempts\)"):
        fetcher.fetch(url)
    assert sleeps == [0.25, 0.5]
    assert leftovers(cache) == []


def test_fetch_checks_the_keyring_before_downloading_the_artifact(
    server: ReleaseServer, cache: Path, keys: Keys, tmp_path: Path, sleeps: list[float]
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    fetcher = make_fetcher(cache, tmp_path / "missing.gpg", sleeps)

    with pytest.raises(DriverError, match=r"cannot read the keyring .*FLATCAR_KEYRING"):
        fetcher.fetch(server.url(ARTIFACT))
    assert server.requests[f"/{ARTIFACT}"] == 0
    assert leftovers(cache) == []


def test_fetch_refuses_unsupported_url_schemes(fetcher: Fetcher) -> None:
    with pytest.raises(DriverError, match="only http, https and file URLs"):
        fetcher.fetch("ftp://example.invalid/flatcar.bin")


# --- both modes ----------------------------------------------------------------------------


def read_whole(fetcher: Fetcher, url: str, mode: str) -> bytes:
    """The artifact at url as a caller gets it: fetched to the cache, or streamed to the end
    (where the stream's checks run)."""
    if mode == "fetch":
        return fetcher.fetch(url).read_bytes()
    with fetcher.stream(url) as stream:
        return stream.read()


@pytest.mark.parametrize("mode", ["fetch", "stream"])
def test_a_signature_by_another_key_is_refused_and_nothing_kept(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher, mode: str
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.other)

    with pytest.raises(DriverError, match=OTHER_KEY):
        read_whole(fetcher, server.url(ARTIFACT), mode)
    assert leftovers(cache) == []


@pytest.mark.parametrize("mode", ["fetch", "stream"])
def test_server_errors_are_retried_with_exponential_backoff(
    server: ReleaseServer, keys: Keys, fetcher: Fetcher, sleeps: list[float], mode: str
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    server.failures[f"/{ARTIFACT}"] = 2

    assert read_whole(fetcher, server.url(ARTIFACT), mode) == CONTENT
    assert server.requests[f"/{ARTIFACT}"] == 3
    assert sleeps == [0.25, 0.5]


# --- streaming mode -------------------------------------------------------------------------


def read_all(stream: BinaryIO) -> bytes:
    return stream.read()


def stream_error(
    fetcher: Fetcher, url: str, read: Callable[[BinaryIO], object], match: str | None = None
) -> DriverError:
    """The one-line error the stream of url raises, by the time its block ends, to a caller that
    reads it with read."""
    with pytest.raises(DriverError, match=match) as raised, fetcher.stream(url) as stream:
        read(stream)
    assert "\n" not in str(raised.value)
    return raised.value


def test_stream_unpacks_a_verified_archive_without_caching_it(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher
) -> None:
    files = {"usr/lib/modules/6.12.81-flatcar/build/Makefile": CONTENT, "etc/os-release": b"x"}
    publish(server.root, ARCHIVE, tarball(files), keys.trusted)

    with (
        fetcher.stream(server.url(ARCHIVE)) as stream,
        tarfile.open(fileobj=stream, mode="r|gz") as archive,
    ):
        # Member by member, as the stream goes: read, never extracted (no extraction filter).
        unpacked = {member.name: _read(archive, member) for member in archive}

    assert unpacked == files
    assert server.requests[f"/{ARCHIVE}"] == 1
    assert leftovers(cache) == []


def _read(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    reader = archive.extractfile(member)
    assert reader is not None, member.name  # the archive holds regular files only
    return reader.read()


def test_stream_verifies_what_the_caller_left_unread(
    server: ReleaseServer, keys: Keys, fetcher: Fetcher
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)

    with fetcher.stream(server.url(ARTIFACT)) as stream:
        assert stream.read(10) == CONTENT[:10]


def test_stream_refuses_a_corrupted_archive_when_the_block_ends(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher
) -> None:
    artifact = publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    artifact.write_bytes(corrupt(CONTENT))
    consumed: list[bytes] = []

    def read(stream: BinaryIO) -> None:
        consumed.append(stream.read())

    stream_error(fetcher, server.url(ARTIFACT), read, "does not match its DIGESTS file")

    assert consumed == [corrupt(CONTENT)]  # the caller saw it all; only the exit refuses it
    assert leftovers(cache) == []


def test_stream_reports_an_unknown_release(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher
) -> None:
    with (
        pytest.raises(DriverError, match=r"does not exist .*check the Flatcar version"),
        fetcher.stream(server.url("amd64-usr/9999.9.9/flatcar-container.tar.gz")),
    ):
        pass
    assert leftovers(cache) == []


def test_stream_passes_the_callers_error_through_and_keeps_nothing(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)

    with pytest.raises(RuntimeError, match="disk full"), fetcher.stream(server.url(ARTIFACT)):
        raise RuntimeError("disk full")
    assert leftovers(cache) == []


# --- streaming mode: the caller fails inside the block --------------------------------------


def incompressible(size: int) -> bytes:
    """Deterministic bytes gzip cannot shrink: the archive stays bigger than one read chunk."""
    blocks = (hashlib.sha512(index.to_bytes(4, "big")).digest() for index in range(size // 64))
    return b"".join(blocks)


BIG_ARCHIVE = tarball({"usr/lib/modules/6.12.81-flatcar/vmlinux": incompressible(3 << 20)})


def first_member(stream: BinaryIO) -> tarfile.TarInfo | None:
    with tarfile.open(fileobj=stream, mode="r|gz") as archive:
        return archive.next()


def read_then_fail(stream: BinaryIO, error: Exception) -> NoReturn:
    """A caller that reads the start of the stream, then fails for a reason of its own."""
    assert stream.read(10) == BIG_ARCHIVE[:10]
    raise error


def read_wrapping_errors(stream: BinaryIO) -> bytes:
    """A caller that reports a failed read as an error of its own, as tar parsers do."""
    try:
        return stream.read()
    except DriverError as exc:
        raise RuntimeError("unexpected end of archive") from exc


def test_stream_reports_a_corrupted_download_the_caller_failed_to_parse(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher
) -> None:
    artifact = publish(server.root, ARCHIVE, BIG_ARCHIVE, keys.trusted)
    artifact.write_bytes(b"\0" + BIG_ARCHIVE[1:])  # no gzip magic: tarfile fails at once

    error = stream_error(fetcher, server.url(ARCHIVE), first_member)

    message = str(error)
    assert "SHA512 of" in message
    assert "does not match its DIGESTS file" in message
    assert "the download is corrupted or truncated; try again" in message
    assert isinstance(error.__cause__, tarfile.ReadError)  # what the caller saw
    assert server.requests[f"/{ARCHIVE}"] == 1
    assert leftovers(cache) == []


def test_stream_passes_the_callers_error_on_unchanged_when_the_download_is_good(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher
) -> None:
    publish(server.root, ARCHIVE, BIG_ARCHIVE, keys.trusted)
    full = OSError(errno.ENOSPC, "No space left on device")

    with (
        pytest.raises(OSError, match="No space left") as raised,
        fetcher.stream(server.url(ARCHIVE)) as stream,
    ):
        read_then_fail(stream, full)

    assert raised.value is full
    assert raised.value.__cause__ is None
    assert server.requests[f"/{ARCHIVE}"] == 1
    assert leftovers(cache) == []


def test_stream_reports_a_truncated_download_the_caller_failed_on_before_its_end(
    server: ReleaseServer, cache: Path, keys: Keys, fetcher: Fetcher
) -> None:
    publish(server.root, ARCHIVE, BIG_ARCHIVE, keys.trusted)
    server.truncated.add(f"/{ARCHIVE}")
    garbage = ValueError("garbage in the tar header")

    error = stream_error(
        fetcher, server.url(ARCHIVE), lambda stream: read_then_fail(stream, garbage)
    )

    message = str(error)
    assert f"truncated: got {len(BIG_ARCHIVE) // 2} of {len(BIG_ARCHIVE)} bytes" in message
    assert message.endswith("discard what was unpacked and try again")
    assert error.__cause__ is garbage
    assert leftovers(cache) == []


@pytest.mark.parametrize(
    ("read", "seen"),
    [(read_all, Exception), (read_wrapping_errors, RuntimeError)],
    ids=["mid-read", "wrapped-by-the-caller"],
)
def test_stream_reports_a_truncated_body_whatever_the_caller_made_of_it(  # noqa: PLR0917 - fixtures
    server: ReleaseServer,
    cache: Path,
    keys: Keys,
    fetcher: Fetcher,
    read: Callable[[BinaryIO], bytes],
    seen: type[Exception],
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    server.truncated.add(f"/{ARTIFACT}")

    error = stream_error(fetcher, server.url(ARTIFACT), read, TRUNCATED)

    assert isinstance(error.__cause__, seen)  # what the caller's read raised, if its own
    assert server.requests[f"/{ARTIFACT}"] == 1
    assert leftovers(cache) == []


# --- a signal during a download -------------------------------------------------------------


def terminate_once_stalled(
    server: ReleaseServer, signalled: list[float], busy: Path | None = None
) -> threading.Thread:
    """SIGTERM to this process once the server has sent half the body and stopped.

    With busy, also once something is in that directory (the extraction has begun).
    """

    def terminate() -> None:
        deadline = time.monotonic() + 10
        while busy is not None and not any(busy.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.01)
        if server.stalling.wait(10):
            time.sleep(0.1)  # the reading thread is now blocked on the socket
            signalled.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=terminate)
    thread.start()
    return thread


def test_a_signal_ends_a_streamed_extraction_at_once_and_keeps_nothing(
    server: ReleaseServer, cache: Path, keys: Keys, tmp_path: Path
) -> None:
    # The extraction reads the download in a thread of its own; before, a signal was drained
    # like a caller's error: the rest of the download was read (or waited for) first.
    publish(server.root, ARCHIVE, BIG_ARCHIVE, keys.trusted)
    server.stalled.add(f"/{ARCHIVE}")
    fetcher = make_fetcher(cache, keys.armored, [], timeout=10)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    signalled: list[float] = []

    thread = terminate_once_stalled(server, signalled, busy=incoming)
    with signals_raise(), pytest.raises(CaughtSignalError):
        extract_container_tree(fetcher.stream(server.url(ARCHIVE)), incoming / "tree", None)
    ended = time.monotonic()
    thread.join()

    assert ended - signalled[0] < 2  # not the 10 s read timeout
    assert leftovers(cache) == []
    assert list(incoming.iterdir()) == []


def test_a_signal_ends_a_download_to_the_cache_at_once_and_keeps_nothing(
    server: ReleaseServer, cache: Path, keys: Keys
) -> None:
    publish(server.root, ARTIFACT, CONTENT, keys.trusted)
    server.stalled.add(f"/{ARTIFACT}")
    fetcher = make_fetcher(cache, keys.armored, [], timeout=10)
    signalled: list[float] = []

    thread = terminate_once_stalled(server, signalled)
    with signals_raise(), pytest.raises(CaughtSignalError):
        fetcher.fetch(server.url(ARTIFACT))
    ended = time.monotonic()
    thread.join()

    assert ended - signalled[0] < 2
    assert leftovers(cache) == []


def test_a_caught_signal_is_not_an_error_a_step_may_handle() -> None:
    assert not issubclass(CaughtSignalError, Exception)
