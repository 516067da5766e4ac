"""Signature policy and Flatcar's key rotation: weak digests, the pinned primary, expired
subkeys, the CI check on the shipped key's expiry, and the runtime refresh of the key."""

from __future__ import annotations

import datetime as dt
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import fetch_gpg
import pytest
from fetch_gpg import Signer, gpg
from fetch_server import ReleaseServer
from tools import require

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.settings import FLATCAR_SIGNING_KEY_URL
from nvidia_driver.sources.download import Backoff, Downloader, DownloadLimits
from nvidia_driver.sources.fetch import Fetcher
from nvidia_driver.sources.openpgp import _packet_header, signature_info
from nvidia_driver.sources.signingkey import (
    FLATCAR_KEY_URL,
    SHIPPED_KEY,
    PublicKey,
    date,
    list_keys,
)
from nvidia_driver.sources.verify import REFRESHED_KEY, Trust

RELEASE = "amd64-usr/4593.2.5"
ARTIFACT = f"{RELEASE}/flatcar_production_image.vmlinuz"
OTHER_ARTIFACT = f"{RELEASE}/flatcar-container.tar.gz"
KEY_PATH = "security/image-signing-key/Flatcar_Image_Signing_Key.asc"
CONTENT = b"kernel image" * 1000
NOW = dt.datetime.now(dt.UTC)


def days_ago(days: int) -> str:
    """A gpg --faked-system-time value."""
    return (NOW - dt.timedelta(days=days)).strftime("%Y%m%dT%H%M%S")


@dataclass
class Flatcar:
    """A throw-away 'Flatcar buildbot': a certify-only primary with signing subkeys."""

    signer: Signer
    first: str  # the subkey the shipped copy knows

    @property
    def primary(self) -> str:
        return self.signer.fingerprint


@pytest.fixture(scope="module")
def gpg_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("gpg", "gpgv", "gpgconf")
    return tmp_path_factory.mktemp("signers")


def new_flatcar(base: Path, name: str, first_expires: str = "1y", made: int = 0) -> Flatcar:
    """A new key in a new home under base (short paths: gpg-agent's socket lives there)."""
    options = ("--faked-system-time", days_ago(made)) if made else ()
    home = Path(tempfile.mkdtemp(prefix="k", dir=base))
    gpg(
        home,
        *options,
        "--quick-gen-key",
        f"{name} <{name}@example.invalid>",
        "ed25519",
        "cert",
        "never",
    )
    listing = gpg(home, "--with-colons", "--list-keys")
    primary = next(line.split(":")[9] for line in listing.splitlines() if line[:4] == "fpr:")
    if made:
        # gpg's faked clock runs on from its start: the subkey's starts a second after the
        # primary's creation, which a busy machine can put seconds past the first start ("key
        # created in the future ... Time conflict" otherwise).
        created = next(
            int(line.split(":")[5]) for line in listing.splitlines() if line[:4] == "pub:"
        )
        options = ("--faked-system-time", str(created + 1))
    signer = Signer(home, primary)
    return Flatcar(signer, signer.add_subkey(first_expires, options=options))


@pytest.fixture
def flatcar(gpg_home: Path) -> Iterator[Flatcar]:
    made = new_flatcar(gpg_home, "buildbot")
    yield made
    made.signer.stop_agent()


@pytest.fixture
def stranger(gpg_home: Path) -> Iterator[Flatcar]:
    made = new_flatcar(gpg_home, "stranger")
    yield made
    made.signer.stop_agent()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ReleaseServer]:
    with ReleaseServer(tmp_path / "release") as release_server:
        yield release_server


def publish(server: ReleaseServer, name: str, signer: Signer, key: str, *options: str) -> None:
    fetch_gpg.publish(server.root, name, CONTENT, signer, key=key, options=options)


def publish_key(server: ReleaseServer, signer: Signer) -> None:
    path = server.root / KEY_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    signer.export(path, armor=True)


def fetcher(cache: Path, keyring: Path, primary: str | None, key_url: str | None) -> Fetcher:
    downloader = Downloader(DownloadLimits(timeout=10), Backoff(attempts=1))
    return Fetcher(cache, Commands(), Trust(keyring, primary, key_url), downloader)


# --- the signature policy -------------------------------------------------------------------


def test_a_sha1_signature_is_refused(
    server: ReleaseServer, flatcar: Flatcar, tmp_path: Path
) -> None:
    publish(server, ARTIFACT, flatcar.signer, flatcar.first, "--digest-algo", "SHA1")
    keyring = flatcar.signer.export(tmp_path / "flatcar.asc", armor=True)

    with pytest.raises(DriverError, match="weak or unknown digest algorithm"):
        fetcher(tmp_path / "cache", keyring, flatcar.primary, None).fetch(server.url(ARTIFACT))


def test_a_signature_whose_validsig_primary_is_not_the_pinned_one_is_refused(
    server: ReleaseServer, flatcar: Flatcar, stranger: Flatcar, tmp_path: Path
) -> None:
    # A keyring holding a second key (a mistake, or a refreshed file carrying one): gpgv alone
    # would accept the stranger's signature.
    keyring = tmp_path / "both.gpg"
    keyring.write_bytes(
        flatcar.signer.export(tmp_path / "f.gpg", armor=False).read_bytes()
        + stranger.signer.export(tmp_path / "s.gpg", armor=False).read_bytes()
    )
    publish(server, ARTIFACT, stranger.signer, stranger.first)

    with pytest.raises(DriverError) as raised:
        fetcher(tmp_path / "cache", keyring, flatcar.primary, None).fetch(server.url(ARTIFACT))

    assert f"whose primary is {stranger.primary}, not the pinned {flatcar.primary}" in str(
        raised.value
    )
    unpinned = fetcher(tmp_path / "cache2", keyring, None, None)
    assert unpinned.fetch(server.url(ARTIFACT)).read_bytes() == CONTENT


def test_a_signature_made_before_its_subkey_expired_still_counts(
    server: ReleaseServer, gpg_home: Path, tmp_path: Path
) -> None:
    # Flatcar's older releases stay signed by subkeys retired since.
    retired = new_flatcar(gpg_home, "buildbot", first_expires="2d", made=10)
    publish(server, ARTIFACT, retired.signer, retired.first, "--faked-system-time", days_ago(9))
    keyring = retired.signer.export(tmp_path / "flatcar.asc", armor=True)

    fetched = fetcher(tmp_path / "cache", keyring, retired.primary, None).fetch(
        server.url(ARTIFACT)
    )

    assert fetched.read_bytes() == CONTENT
    retired.signer.stop_agent()


def test_a_signature_made_after_its_subkey_expired_is_refused_whatever_the_nodes_clock(
    server: ReleaseServer, flatcar: Flatcar, tmp_path: Path
) -> None:
    # Signed 3 days from now by a subkey that expires tomorrow: a node whose clock is behind
    # (gpgv then reports GOODSIG, no EXPKEYSIG) must judge it as one whose clock is right.
    publish(server, ARTIFACT, flatcar.signer, flatcar.first, "--faked-system-time", days_ago(-3))
    flatcar.signer.set_subkey_expiry(flatcar.first, "1d")
    keyring = flatcar.signer.export(tmp_path / "flatcar.asc", armor=True)

    with pytest.raises(DriverError, match=r"signed on .* by subkey .*, which had expired on "):
        fetcher(tmp_path / "cache", keyring, flatcar.primary, None).fetch(server.url(ARTIFACT))


def test_a_subkey_dated_after_the_nodes_clock_names_the_clock(
    server: ReleaseServer, flatcar: Flatcar, tmp_path: Path
) -> None:
    # A node whose clock is behind the day Flatcar made its new subkey: gpg's own words are
    # "key ... was created 1 day in the future (time warp or clock problem)", ERRSIG code 39.
    ahead = days_ago(-2)
    subkey = flatcar.signer.add_subkey("1y", options=("--faked-system-time", ahead))
    publish(server, ARTIFACT, flatcar.signer, subkey, "--faked-system-time", days_ago(-3))
    keyring = flatcar.signer.export(tmp_path / "flatcar.asc", armor=True)

    with pytest.raises(DriverError, match=r"after the node's clock .*: check the node's clock"):
        fetcher(tmp_path / "cache", keyring, flatcar.primary, None).fetch(server.url(ARTIFACT))


def test_signature_info_reads_the_creation_time_and_issuer(
    flatcar: Flatcar, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.write_bytes(b"x")
    signature = flatcar.signer.sign(data, key=flatcar.first)
    packets = gpg(flatcar.signer.home, "--list-packets", signature)

    info = signature_info(signature.read_bytes())

    assert f"created {info.created}" in packets
    assert info.issuer_fingerprint == flatcar.first
    assert info.issued_by(flatcar.first)
    assert not info.issued_by(flatcar.primary)
    armored = flatcar.signer.sign(
        data, tmp_path / "data.asc", key=flatcar.first, options=("--armor",)
    )
    assert signature_info(armored.read_bytes()).issuer_fingerprint == flatcar.first
    assert signature_info(b"\x00garbage").created is None


# --- the shipped key's expiry (the CI check) ------------------------------------------------


SHIPPED_KEY_IN_REPOSITORY = (
    "entrypoint/src/nvidia_driver/sources/keys/flatcar-image-signing-key.asc"
)
EXPIRY_MARGIN = dt.timedelta(days=30)


def newest_signing_subkey(keys: Sequence[PublicKey]) -> PublicKey | None:
    candidates = [
        key
        for key in keys
        if key.fingerprint != key.primary and "s" in key.capabilities and not key.revoked
    ]
    return max(candidates, key=lambda key: key.created, default=None)


def expiry_warning(
    keys: Sequence[PublicKey],
    now: dt.datetime,
    key_file: str = SHIPPED_KEY_IN_REPOSITORY,
    margin: dt.timedelta = EXPIRY_MARGIN,
) -> str | None:
    """Why the key needs replacing within ``margin``; None when its newest subkey lasts.
    Flatcar replaces its signing subkey every year or two, once on the expiry day itself: CI
    warns ahead (docs/building.md)."""
    newest = newest_signing_subkey(keys)
    what = f"update {key_file} from {FLATCAR_KEY_URL} (see keys/README.md)"
    if newest is None:
        return f"the key in {key_file} has no usable signing subkey: {what}"
    if newest.expires is None:
        return None
    left = dt.datetime.fromtimestamp(newest.expires, dt.UTC) - now
    if left > margin:
        return None
    return (
        f"Flatcar's newest signing subkey {newest.fingerprint} expires on "
        f"{date(newest.expires)}, in {left.days} days: {what}"
    )


def test_the_shipped_keys_newest_signing_subkey_lasts_more_than_30_days(tmp_path: Path) -> None:
    keys = list_keys(Commands(), [SHIPPED_KEY], tmp_path / "gnupg")

    warning = expiry_warning(keys, NOW)

    assert warning is None, warning


@pytest.mark.parametrize(("days", "warned"), [(10, True), (400, False)])
def test_the_expiry_check_warns_30_days_ahead(
    gpg_home: Path, tmp_path: Path, days: int, warned: bool
) -> None:
    key = new_flatcar(gpg_home, "buildbot", first_expires=f"{days}d")
    exported = key.signer.export(tmp_path / "key.asc", armor=True)
    key.signer.stop_agent()

    warning = expiry_warning(list_keys(Commands(), [exported], tmp_path / "gnupg"), NOW)

    if not warned:
        assert warning is None
        return
    assert warning is not None
    assert warning.startswith(f"Flatcar's newest signing subkey {key.first} expires on ")
    assert re.search(rf", in ({days - 1}|{days}) days: update ", warning)
    assert warning.endswith(
        "update entrypoint/src/nvidia_driver/sources/keys/flatcar-image-signing-key.asc from "
        "https://www.flatcar.org/security/image-signing-key/Flatcar_Image_Signing_Key.asc "
        "(see keys/README.md)"
    )
    assert "\n" not in warning


# --- refreshing the key when Flatcar rotates its subkey -------------------------------------


def rotated(flatcar: Flatcar, tmp_path: Path) -> tuple[Path, str]:
    """The shipped copy (first subkey only), then a new subkey Flatcar signs with."""
    shipped = flatcar.signer.export(tmp_path / "shipped.asc", armor=True)
    return shipped, flatcar.signer.add_subkey("2y")


def test_a_rotated_subkey_is_fetched_once_verified_cached_and_used_afterwards(
    server: ReleaseServer, flatcar: Flatcar, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped, new = rotated(flatcar, tmp_path)
    publish(server, ARTIFACT, flatcar.signer, new)
    publish(server, OTHER_ARTIFACT, flatcar.signer, new)
    publish_key(server, flatcar.signer)
    cache = tmp_path / "cache"

    first = fetcher(cache, shipped, flatcar.primary, server.url(KEY_PATH))
    assert first.fetch(server.url(ARTIFACT)).read_bytes() == CONTENT

    log = capsys.readouterr().out
    assert f"Refreshed Flatcar's signing key from {server.url(KEY_PATH)}" in log
    assert f"subkey {new} (expires " in log
    assert f"is bound to {flatcar.primary}; cached in {cache / REFRESHED_KEY}" in log
    assert (cache / REFRESHED_KEY).is_file()
    # A later run (a new Fetcher) uses the cached key: no second request for it.
    again = fetcher(cache, shipped, flatcar.primary, server.url(KEY_PATH))
    assert again.fetch(server.url(OTHER_ARTIFACT)).read_bytes() == CONTENT
    assert server.requests[f"/{KEY_PATH}"] == 1


def test_the_refresh_works_in_a_deep_cache_directory(
    server: ReleaseServer, flatcar: Flatcar, tmp_path: Path
) -> None:
    # gpg --import fails once its home's agent socket path passes sun_path's 108 bytes; the
    # refresh's scratch under this cache is deeper than that.
    shipped, new = rotated(flatcar, tmp_path)
    publish(server, ARTIFACT, flatcar.signer, new)
    publish_key(server, flatcar.signer)
    cache = tmp_path / ("deep-" * 20) / "cache"

    fetch = fetcher(cache, shipped, flatcar.primary, server.url(KEY_PATH))
    assert fetch.fetch(server.url(ARTIFACT)).read_bytes() == CONTENT
    assert (cache / REFRESHED_KEY).is_file()


def test_a_refresh_without_a_writable_temporary_directory_fails_in_one_line(
    server: ReleaseServer,
    flatcar: Flatcar,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """readOnlyRootFilesystem without /tmp mounted: a DriverError (a held verdict in the reboot
    gate), never the FileNotFoundError of tempfile that crash-looped it."""
    shipped, new = rotated(flatcar, tmp_path)
    publish(server, ARTIFACT, flatcar.signer, new)
    publish_key(server, flatcar.signer)
    fetch = fetcher(tmp_path / "cache", shipped, flatcar.primary, server.url(KEY_PATH))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-tmp"))

    with pytest.raises(DriverError, match="signed by a key that is not in the keyring"):
        fetch.fetch(server.url(ARTIFACT))
    assert "no writable temporary directory for gpg" in capsys.readouterr().out


def test_a_published_key_with_another_primary_is_refused(
    server: ReleaseServer,
    flatcar: Flatcar,
    stranger: Flatcar,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shipped, new = rotated(flatcar, tmp_path)
    publish(server, ARTIFACT, flatcar.signer, new)
    publish(server, OTHER_ARTIFACT, flatcar.signer, new)
    publish_key(server, stranger.signer)  # a mirror or proxy serving some other key
    cache = tmp_path / "cache"
    fetch = fetcher(cache, shipped, flatcar.primary, server.url(KEY_PATH))

    with pytest.raises(DriverError, match="signed by a key that is not in the keyring"):
        fetch.fetch(server.url(ARTIFACT))
    with pytest.raises(DriverError, match="signed by a key that is not in the keyring"):
        fetch.fetch(server.url(OTHER_ARTIFACT))

    log = capsys.readouterr().out
    assert (
        f"WARNING: Flatcar's signing key was not refreshed from {server.url(KEY_PATH)} (the "
        f"signature is by {new}, a subkey the keyring lacks): it holds {stranger.primary}, "
        f"not Flatcar's primary key {flatcar.primary}"
    ) in log
    assert server.requests[f"/{KEY_PATH}"] == 1  # one fetch, not one per artifact
    assert not (cache / REFRESHED_KEY).exists()


def test_a_published_subkey_not_bound_to_the_primary_is_refused(
    server: ReleaseServer,
    flatcar: Flatcar,
    stranger: Flatcar,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The published file has Flatcar's primary, plus the stranger's subkey with the stranger's
    # binding signature spliced in: gpg drops it, so the refresh brings nothing that verifies.
    shipped = flatcar.signer.export(tmp_path / "shipped.asc", armor=True)
    ours = packets(flatcar.signer.export(tmp_path / "f.gpg", armor=False).read_bytes())
    theirs = packets(stranger.signer.export(tmp_path / "s.gpg", armor=False).read_bytes())
    subkey_and_binding = [packet for tag, packet in theirs[3:] if tag in (14, 2)]
    forged = server.root / KEY_PATH
    forged.parent.mkdir(parents=True)
    forged.write_bytes(b"".join(packet for _, packet in ours) + b"".join(subkey_and_binding))
    publish(server, ARTIFACT, stranger.signer, stranger.first)
    cache = tmp_path / "cache"

    with pytest.raises(DriverError, match="signed by a key that is not in the keyring"):
        fetcher(cache, shipped, flatcar.primary, server.url(KEY_PATH)).fetch(server.url(ARTIFACT))

    assert "it has no valid subkey for this signature either" in capsys.readouterr().out
    assert not (cache / REFRESHED_KEY).exists()


def test_a_subkey_whose_expiry_flatcar_extended_is_refreshed(
    server: ReleaseServer, gpg_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The shipped copy says the subkey expired 8 days ago; Flatcar extended it and signed today.
    extended = new_flatcar(gpg_home, "buildbot", first_expires="2d", made=10)
    shipped = extended.signer.export(tmp_path / "shipped.asc", armor=True)
    extended.signer.set_subkey_expiry(extended.first, "1y")
    publish(server, ARTIFACT, extended.signer, extended.first)
    cache = tmp_path / "cache"

    without_refresh = fetcher(tmp_path / "plain", shipped, extended.primary, None)
    with pytest.raises(DriverError, match=r"signed on .* by subkey .*, which had expired on "):
        without_refresh.fetch(server.url(ARTIFACT))

    publish_key(server, extended.signer)
    refreshing = fetcher(cache, shipped, extended.primary, server.url(KEY_PATH))
    assert refreshing.fetch(server.url(ARTIFACT)).read_bytes() == CONTENT
    assert "which expired on" in capsys.readouterr().out
    extended.signer.stop_agent()


def test_an_unreachable_key_url_leaves_the_refusal_and_one_warning(
    server: ReleaseServer, flatcar: Flatcar, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped, new = rotated(flatcar, tmp_path)
    publish(server, ARTIFACT, flatcar.signer, new)

    with pytest.raises(DriverError, match="not in the keyring"):
        fetcher(tmp_path / "cache", shipped, flatcar.primary, server.url(KEY_PATH)).fetch(
            server.url(ARTIFACT)
        )

    warnings = [line for line in capsys.readouterr().out.splitlines() if "not refreshed" in line]
    assert len(warnings) == 1
    assert "does not exist (HTTP 404)" in warnings[0]
    # Not the artifacts' "no such Flatcar release": the version is right, the key's URL is not.
    assert "Flatcar version" not in warnings[0]
    assert warnings[0].endswith(f"check {FLATCAR_SIGNING_KEY_URL}")


def packets(data: bytes) -> list[tuple[int, bytes]]:
    found = []
    offset = 0
    while offset < len(data):
        tag, start, length = _packet_header(data, offset)
        found.append((tag, data[offset : start + length]))
        offset = start + length
    return found
