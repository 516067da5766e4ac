"""Flatcar's image-signing key: its subkeys, their expiry, and accepting a refreshed copy.

Flatcar signs releases with subkeys of one primary key, ``F88C…B34A``, and replaces the
signing subkey every year or two, announced on its mailing list and published at
``FLATCAR_KEY_URL`` (the last replacement came out on the expiry day itself). The entrypoint
ships the key in ``keys/``; this module reads keys with ``gpg`` in a throw-away home (never the
user's), which also checks every self-signature and subkey binding: ``gpg`` leaves out a subkey
whose binding signature by the primary is missing or wrong.
"""

from __future__ import annotations

import datetime as dt
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.safetext import shown

FLATCAR_PRIMARY = "F88CFEDEFF29A5B4D9523864E25D9AED0593B34A"
# flatcar/flatcar-website static/security/image-signing-key/Flatcar_Image_Signing_Key.asc, the
# file Flatcar's "verify images" documentation imports.
FLATCAR_KEY_URL = "https://www.flatcar.org/security/image-signing-key/Flatcar_Image_Signing_Key.asc"
SHIPPED_KEY = Path(__file__).parent / "keys" / "flatcar-image-signing-key.asc"
KEY_FILE_LIMIT = 1 << 20  # Flatcar's key file is about 20 KB

_KEY_RECORDS = frozenset({"pub", "sub"})
_FIELD_VALIDITY, _FIELD_CREATED, _FIELD_EXPIRES, _FIELD_CAPABILITIES = 1, 5, 6, 11
_FINGERPRINT_FIELD = 9
_MIN_KEY_FIELDS = 12
_DIGITS = re.compile("[0-9]+")


@dataclass(frozen=True)
class PublicKey:
    """A primary key or subkey, as gpg lists it once its signatures are checked."""

    fingerprint: str
    primary: str  # the fingerprint of its primary key (its own, for a primary)
    created: int
    expires: int | None
    revoked: bool
    capabilities: str

    def expired_at(self, moment: int) -> bool:
        return self.expires is not None and moment > self.expires


def date(stamp: int) -> str:
    return dt.datetime.fromtimestamp(stamp, dt.UTC).strftime("%Y-%m-%d")


def parse_listing(text: str) -> tuple[PublicKey, ...]:
    """The keys of ``gpg --with-colons --with-subkey-fingerprints`` output."""
    keys: list[PublicKey] = []
    pending: list[str] | None = None
    primary = ""
    for line in text.splitlines():
        fields = line.split(":")
        if fields[0] in _KEY_RECORDS and len(fields) >= _MIN_KEY_FIELDS:
            pending = fields
        elif fields[0] == "fpr" and pending is not None and len(fields) > _FINGERPRINT_FIELD:
            fingerprint = fields[_FINGERPRINT_FIELD].upper()
            if pending[0] == "pub":
                primary = fingerprint
            keys.append(_key(pending, fingerprint, primary))
            pending = None
    return tuple(keys)


def list_keys(commands: Commands, files: Sequence[Path], home: Path) -> tuple[PublicKey, ...]:
    """The valid keys in key files (armored or binary), read by gpg in the throw-away ``home``."""
    home.mkdir(mode=0o700, exist_ok=True)
    result = commands.run(
        "gpg", *_gpg_options(home), "--with-colons", "--fixed-list-mode",
        "--with-subkey-fingerprints", "--list-options", "show-unusable-subkeys",
        "--show-keys", *files, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        reason = next((line for line in result.stderr.splitlines() if line.strip()), "no output")
        raise DriverError(f"gpg cannot read the key in {', '.join(map(str, files))}: {reason}")
    return parse_listing(result.stdout)


def merge_published_key(
    commands: Commands, published: bytes, current: Sequence[Path], pinned: str, home: Path
) -> bytes:
    """The pinned key with the subkeys of ``current`` and ``published``, as a binary keyring.

    Refused unless every key in ``published`` has the pinned primary. gpg drops subkeys whose
    binding signature by that primary does not verify.
    """
    home.mkdir(mode=0o700, exist_ok=True)
    fetched = home / "published.asc"
    fetched.write_bytes(published)
    primaries = {key.primary for key in list_keys(commands, [fetched], home / "show")}
    if primaries != {pinned}:
        holds = ", ".join(sorted(primaries)) or "no valid key"
        raise DriverError(f"it holds {holds}, not Flatcar's primary key {pinned}")
    # gpg --import fails ("can't connect to the agent: File name too long") once its home's
    # agent socket path passes sun_path's 108 bytes, as a deep cache directory makes it: the
    # keyring is built in a short home of its own under the system's temporary directory.
    try:
        temporary = tempfile.TemporaryDirectory(prefix="gpg-")
    except OSError as exc:  # a read-only root without /tmp mounted (the reboot gate's pod)
        raise DriverError(
            f"no writable temporary directory for gpg's home ({shown(str(exc), 160)}): mount "
            "an emptyDir at /tmp, as deploy/reboot-gate does, or set TMPDIR"
        ) from None
    with temporary as keyring_home:
        short_home = Path(keyring_home)
        commands.run("gpg", *_gpg_options(short_home), "--import", *current, fetched)
        merged = short_home / "merged.gpg"
        commands.run("gpg", *_gpg_options(short_home), "--output", merged, "--export", pinned)
        return merged.read_bytes()


def _gpg_options(home: Path) -> list[str]:
    return ["--homedir", str(home), "--batch", "--no-autostart", "--no-tty", "--quiet"]


def _key(fields: list[str], fingerprint: str, primary: str) -> PublicKey:
    expires = fields[_FIELD_EXPIRES]
    return PublicKey(
        fingerprint=fingerprint,
        primary=primary,
        created=_number(fields[_FIELD_CREATED]),
        expires=_number(expires) if expires else None,
        revoked=fields[_FIELD_VALIDITY] == "r",
        capabilities=fields[_FIELD_CAPABILITIES],
    )


def _number(field: str) -> int:
    if not _DIGITS.fullmatch(field):
        raise DriverError(f"gpg listed a key time that is not a number ({field!r})")
    return int(field)
