"""Throw-away OpenPGP keys for the fetch tests, each in its own GNUPGHOME, and the signed
artifacts they publish."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fetch_server import flatcar_digests
from tools import require

# An empty passphrase, supplied without a pinentry: the tests never wait for a prompt.
_UNATTENDED = ["--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase", ""]


def gpg(home: Path, *args: str | Path) -> str:
    result = subprocess.run(
        ["gpg", "--homedir", str(home), *_UNATTENDED, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"gpg {' '.join(map(str, args))} failed: {result.stderr.strip()}")
    return result.stdout


@dataclass(frozen=True)
class Signer:
    home: Path
    fingerprint: str

    @classmethod
    def create(cls, home: Path, user_id: str) -> Signer:
        home.mkdir(mode=0o700)
        gpg(home, "--quick-gen-key", user_id, "ed25519", "sign", "never")
        listing = gpg(home, "--with-colons", "--list-secret-keys")
        fingerprint = next(
            line.split(":")[9] for line in listing.splitlines() if line[:4] == "fpr:"
        )
        return cls(home, fingerprint)

    def sign(
        self,
        path: Path,
        signature: Path | None = None,
        *,
        key: str | None = None,
        options: tuple[str, ...] = (),
    ) -> Path:
        """A detached binary signature, as Flatcar publishes next to each artifact.

        key: a subkey fingerprint to sign with (default: the primary's signing key); options:
        more gpg options (--digest-algo SHA1, --faked-system-time ...).
        """
        target = signature or path.with_name(f"{path.name}.sig")
        user = f"{key}!" if key else self.fingerprint
        gpg(self.home, *options, "--local-user", user, "--output", target, "--detach-sign", path)
        return target

    def add_subkey(self, expires: str, *, options: tuple[str, ...] = ()) -> str:
        """A new ed25519 signing subkey (gpg expiry syntax: 10d, 1y, never); its fingerprint."""
        gpg(self.home, *options, "--quick-add-key", self.fingerprint, "ed25519", "sign", expires)
        listing = gpg(self.home, "--with-colons", "--list-keys", self.fingerprint)
        return [line.split(":")[9] for line in listing.splitlines() if line[:4] == "fpr:"][-1]

    def set_subkey_expiry(self, subkey: str, expires: str) -> None:
        gpg(self.home, "--quick-set-expire", self.fingerprint, expires, subkey)

    def export(self, destination: Path, *, armor: bool) -> Path:
        gpg(self.home, *(["--armor"] if armor else []), "--output", destination, "--export")
        return destination

    def stop_agent(self) -> None:
        subprocess.run(
            ["gpgconf", "--homedir", str(self.home), "--kill", "all"],
            capture_output=True,
            check=False,
        )


def publish(
    root: Path,
    name: str,
    content: bytes,
    signer: Signer,
    *,
    key: str | None = None,
    options: tuple[str, ...] = (),
) -> Path:
    """Put an artifact with its DIGESTS file and detached signature on the release server
    (Signer.sign's key and options)."""
    artifact = root / name
    artifact.parent.mkdir(parents=True, exist_ok=True)
    artifact.write_bytes(content)
    artifact.with_name(f"{artifact.name}.DIGESTS").write_text(
        flatcar_digests(artifact.name, content)
    )
    signer.sign(artifact, key=key, options=options)
    return artifact


@dataclass(frozen=True)
class Keys:
    trusted: Signer
    other: Signer
    armored: Path  # the trusted public key, as FLATCAR_KEYRING may name it
    binary: Path


@contextmanager
def release_keys(base: Path) -> Iterator[Keys]:
    require("gpg", "gpgv", "gpgconf")
    trusted = Signer.create(base / "trusted", "Test Release Builder <trusted@example.invalid>")
    other = Signer.create(base / "other", "Somebody Else <other@example.invalid>")
    try:
        yield Keys(
            trusted,
            other,
            armored=trusted.export(base / "keyring.asc", armor=True),
            binary=trusted.export(base / "keyring.gpg", armor=False),
        )
    finally:
        trusted.stop_agent()
        other.stop_agent()
