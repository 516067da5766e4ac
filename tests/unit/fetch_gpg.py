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
        check=True,
    )
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

    def sign(self, path: Path, signature: Path | None = None) -> Path:
        """A detached binary signature, as Flatcar publishes next to each artifact."""
        target = signature or path.with_name(f"{path.name}.sig")
        gpg(self.home, "--local-user", self.fingerprint, "--output", target, "--detach-sign", path)
        return target

    def export(self, destination: Path, *, armor: bool) -> Path:
        gpg(self.home, *(["--armor"] if armor else []), "--output", destination, "--export")
        return destination

    def stop_agent(self) -> None:
        subprocess.run(
            ["gpgconf", "--homedir", str(self.home), "--kill", "all"],
            capture_output=True,
            check=False,
        )
