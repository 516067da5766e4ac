"""Throw-away OpenPGP keys for the fetch tests, each in its own GNUPGHOME."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

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
