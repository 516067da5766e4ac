"""Which key a Flatcar artifact's signature must verify against, and refreshing that key.

By default the keyring is Flatcar's image-signing key shipped in ``keys/``, and VALIDSIG must
name its primary, ``F88C…B34A``. When Flatcar rotates its signing subkey before the image is
updated, a signature comes by a subkey the shipped key lacks (or one whose expiry Flatcar has
since extended): that triggers **one** download of Flatcar's published key
(``FLATCAR_SIGNING_KEY_URL``), accepted only if every key in it has the pinned primary, merged
with the shipped key by gpg (which drops subkeys not properly bound to the primary), and used
only if it has a valid subkey for the signature. The merged key is kept beside the downloads
(the work directory, cleared after each runtime build) and tried first until then. One line is
logged either way.

``FLATCAR_KEYRING`` replaces all of this with a keyring of your own: any key in it may sign,
and nothing is refreshed.

A signature by a subkey that has expired *since* counts (Flatcar's older releases stay signed
by retired subkeys); one made *after* its subkey expired does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from nvidia_driver.atomic import write_atomically
from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.log import say, warn
from nvidia_driver.settings import FLATCAR_KEYRING, FLATCAR_SIGNING_KEY_URL
from nvidia_driver.sources.download import Downloader
from nvidia_driver.sources.openpgp import (
    SignatureInfo,
    dearmor,
    is_armored_key,
    signature_info,
    verdict,
)
from nvidia_driver.sources.signingkey import (
    FLATCAR_KEY_URL,
    FLATCAR_PRIMARY,
    KEY_FILE_LIMIT,
    SHIPPED_KEY,
    PublicKey,
    date,
    list_keys,
    merge_published_key,
)

REFRESHED_KEY = Path("keys") / "flatcar-image-signing-key.refreshed.gpg"


@dataclass(frozen=True)
class Trust:
    """The keyring signatures must verify against, its pinned primary, where to refresh it."""

    keyring: Path = SHIPPED_KEY
    primary: str | None = FLATCAR_PRIMARY  # None: any key in the keyring
    key_url: str | None = None  # None: never refreshed

    @classmethod
    def of_keyring(cls, keyring: Path) -> Trust:
        """A keyring of one's own: any key in it, never refreshed."""
        return cls(keyring, None, None)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Trust:
        configured = env.get(FLATCAR_KEYRING, "").strip()
        if configured:
            return cls.of_keyring(Path(configured))
        url = env.get(FLATCAR_SIGNING_KEY_URL, "").strip() or FLATCAR_KEY_URL
        return cls(key_url=None if url.lower() == "none" else url)


class SignatureCheck:
    """Chooses the keyrings for one signature, refreshes them once if needed, judges gpgv."""

    def __init__(
        self, commands: Commands, trust: Trust, cache_dir: Path, downloader: Downloader
    ) -> None:
        self.commands = commands
        self.trust = trust
        self.refreshed = cache_dir / REFRESHED_KEY
        self.downloader = downloader
        self._refresh_tried = False
        self._listings: dict[tuple[Path, ...], tuple[PublicKey, ...]] = {}

    def keyrings(self, scratch: Path) -> list[Path]:
        """Binary keyrings for gpgv: the refreshed key first, if there is one."""
        *refreshed, configured = self._sources()
        return [*refreshed, self._binary(configured, scratch)]

    def prepare(self, url: str, signature: Path, scratch: Path) -> list[Path]:
        """The keyrings to check ``signature`` with, refreshed first if they cannot."""
        keyrings = self.keyrings(scratch)
        if self.trust.key_url is None or self.trust.primary is None:
            return keyrings
        info = signature_info(signature.read_bytes())
        try:
            reason = self._why_refresh(info, scratch)
        except DriverError as exc:  # gpgv still decides; only the refresh is off
            warn(f"cannot tell whether Flatcar's signing key needs refreshing: {exc}")
            return keyrings
        if reason is None:
            return keyrings
        return self._refresh(url, info, reason, scratch) or keyrings

    def check(self, url: str, returncode: int, output: str, scratch: Path) -> None:
        """Raise unless gpgv's output is a valid signature by a trusted, then valid, key."""
        result = verdict(returncode, output, self.trust.primary)
        problem = result.problem
        # Judged by the signature's date, not by gpgv's EXPKEYSIG: that compares the expiry
        # with the node's clock, so a node whose clock is behind would let it through.
        if problem is None:
            problem = self._made_after_expiry(result.signer, result.created, scratch)
        if problem is not None:
            raise DriverError(
                f"signature check of {url} failed: {problem} (keyring {self.trust.keyring}; "
                f"{FLATCAR_KEYRING} selects another)"
            )

    def _why_refresh(self, info: SignatureInfo, scratch: Path) -> str | None:
        issuer = info.issuer_fingerprint or info.issuer_key_id
        if issuer is None:
            return None  # gpgv will say what it is
        signer = _signer(info, self._list(scratch))
        if signer is None:
            return f"the signature is by {issuer}, a subkey the keyring lacks"
        if info.created is not None and signer.expired_at(info.created):
            return (
                f"the signature is by {signer.fingerprint}, which expired on "
                f"{date(signer.expires or 0)} in the keyring, before it was made"
            )
        return None

    def _refresh(
        self, url: str, info: SignatureInfo, reason: str, scratch: Path
    ) -> list[Path] | None:
        key_url, primary = self.trust.key_url, self.trust.primary
        if self._refresh_tried or key_url is None or primary is None:
            return None
        self._refresh_tried = True
        try:
            merged, signer = self._published_key(info, key_url, primary, scratch)
        except DriverError as exc:
            warn(f"Flatcar's signing key was not refreshed from {key_url} ({reason}): {exc}")
            return None
        write_atomically(self.refreshed, merged)
        expires = f"expires {date(signer.expires)}" if signer.expires else "does not expire"
        say(
            f"Refreshed Flatcar's signing key from {key_url} for {url} ({reason}): subkey "
            f"{signer.fingerprint} ({expires}) is bound to {primary}; cached in {self.refreshed}"
        )
        return self.keyrings(scratch)

    def _published_key(
        self, info: SignatureInfo, key_url: str, primary: str, scratch: Path
    ) -> tuple[bytes, PublicKey]:
        """The published key merged into ours, and its subkey that made the signature."""
        # A missing key file means a wrong URL, not the release's missing artifact.
        downloader = replace(self.downloader, missing=f"check {FLATCAR_SIGNING_KEY_URL}")
        published = downloader.get_small(key_url, KEY_FILE_LIMIT, "an OpenPGP key")
        merged = merge_published_key(
            self.commands, published, self._sources(), primary, scratch / "refresh"
        )
        candidate = scratch / "refreshed.gpg"
        candidate.write_bytes(merged)
        signer = _signer(info, list_keys(self.commands, [candidate], scratch / "check"))
        if signer is None or signer.revoked:
            raise DriverError("it has no valid subkey for this signature either")
        if info.created is not None and signer.expired_at(info.created):
            raise DriverError(f"its subkey {signer.fingerprint} had expired by then too")
        return merged, signer

    def _made_after_expiry(
        self, signer: str | None, created: int | None, scratch: Path
    ) -> str | None:
        keys = self._list(scratch)
        key = next((key for key in keys if key.fingerprint == signer), None)
        if key is None or created is None or not key.expired_at(created):
            return None
        return (
            f"signed on {date(created)} by subkey {key.fingerprint}, which had expired on "
            f"{date(key.expires or 0)}: get Flatcar's current key (see {FLATCAR_SIGNING_KEY_URL})"
        )

    def _sources(self) -> list[Path]:
        """The key files behind keyrings(), in the same order."""
        refreshed = self.trust.key_url is not None and self.refreshed.is_file()
        return [*([self.refreshed] if refreshed else []), self.trust.keyring]

    def _list(self, scratch: Path) -> tuple[PublicKey, ...]:
        """The keys gpgv is given, with their validity (listed once per set of key files)."""
        sources = tuple(self._sources())
        if sources not in self._listings:
            self._listings[sources] = list_keys(self.commands, sources, scratch / "listing")
        return self._listings[sources]

    @staticmethod
    def _binary(keyring: Path, scratch: Path) -> Path:
        try:
            content = keyring.read_bytes()
        except OSError as exc:
            raise DriverError(
                f"cannot read the keyring {keyring} ({exc.strerror or exc}); "
                f"point {FLATCAR_KEYRING} at a keyring or rebuild the image"
            ) from exc
        if not is_armored_key(content):
            return keyring.resolve()  # gpgv takes bare names as relative to its home
        try:
            packets = dearmor(content.decode("ascii"))
        except ValueError as exc:
            raise DriverError(f"the keyring {keyring} is not a valid key: {exc}") from exc
        binary = scratch / "keyring.gpg"
        binary.write_bytes(packets)
        return binary


def _signer(info: SignatureInfo, keys: tuple[PublicKey, ...]) -> PublicKey | None:
    return next((key for key in keys if info.issued_by(key.fingerprint)), None)
