"""``invoke sign``: cosign signatures and SBOM attestations for the published images.

For each image of the matrix that the registry holds (the digest of its first tag; its other
tags point at the same digest), once per digest:

* ``cosign sign --yes [--key K] <repository>@<digest>``, unless the registry already has
  cosign's signature tag ``sha256-<hex>.sig`` for it;
* ``syft scan registry:<repository>@<digest> -o spdx-json=<file>``, then ``cosign attest --yes
  [--key K] --type spdxjson --predicate <file> <repository>@<digest>``, unless it has
  ``sha256-<hex>.att``. Without syft on PATH the attestation is skipped, saying so. With
  ``--syft-sha256`` (the workflows pass the pinned build's), syft runs only if its binary has
  that SHA-256, by the absolute path that was checked.

Without --key, cosign signs keyless (Sigstore; in GitHub Actions through the job's OIDC token,
which needs ``permissions: id-token: write``). cosign and syft log in to the registry with the
docker config (``docker login``). The skip checks assume cosign's tag-based storage (cosign 2).

Users verify an image signed in this repository's workflows with::

    cosign verify ghcr.io/<owner>/driver:<tag> \\
      --certificate-oidc-issuer https://token.actions.githubusercontent.com \\
      --certificate-identity-regexp '^https://github.com/<owner>/gpu-driver-container/'
    cosign verify-attestation --type spdxjson ghcr.io/<owner>/driver:<tag> (same two flags)
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from gdc import commands
from gdc.commands import Runner
from gdc.matrix import Matrix
from gdc.registry import Registry, Repository
from gdc.text import counts, format_table
from nvidia_driver.digests import SHA256_HEX
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import plain_http

NO_COSIGN = (
    "cosign is not on PATH: nothing signed; install it "
    "(https://docs.sigstore.dev/cosign/system_config/installation/) or use --require-cosign "
    "to make this an error"
)
NO_SYFT = "syft is not on PATH: signatures only, no SBOM attestations; install syft for them"
MAX_SYFT_BYTES = 512 << 20  # a bound for reading it: syft's binary is a fraction of it


class SignError(RuntimeError):
    """cosign or syft failed; their own output, above, says why."""


class Status(StrEnum):
    SIGNED = "signed"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class Signed:
    tag: str
    digest: str
    status: Status
    detail: str


@dataclass(frozen=True)
class Signer:
    """The cosign and syft command lines for one repository; runner runs them."""

    repository: Repository
    key: str = ""
    runner: Runner = commands.run
    syft: str = "syft"  # the command, or the absolute path of the checked binary

    def _cosign(self, command: str, *args: str) -> list[str]:
        argv = ["cosign", command, "--yes"]
        if self.key:
            argv += ["--key", self.key]
        if plain_http(self.repository.host):
            argv.append("--allow-http-registry")
        return [*argv, *args]

    def sign_argv(self, reference: str) -> list[str]:
        return self._cosign("sign", reference)

    def sbom_argv(self, reference: str, output: Path) -> list[str]:
        argv = [self.syft, "scan", f"registry:{reference}", "-o", f"spdx-json={output}"]
        if plain_http(self.repository.host):
            argv = ["env", "SYFT_REGISTRY_INSECURE_USE_HTTP=true", *argv]
        return argv

    def attest_argv(self, reference: str, predicate: Path) -> list[str]:
        return self._cosign("attest", "--type", "spdxjson", "--predicate", str(predicate),
                            reference)  # fmt: skip

    def run(self, argv: list[str]) -> None:
        try:
            code = self.runner(argv)
        except OSError as exc:
            raise SignError(f"cannot run {argv[0]}: {exc}") from None
        if code != 0:
            command = argv[2] if argv[0] == "env" else argv[0]
            raise SignError(f"{Path(command).name} {argv[argv.index(command) + 1]} exited {code}: "
                            "see its output above")  # fmt: skip


def check_sha256(value: str) -> None:
    """Refuse a --syft-sha256 that is not 64 lowercase hex digits, before any network call: as
    given, since pinned_syft compares it with hashlib's digest (not normalised, as
    nvidia_driver.digests.valid_sha256 would)."""
    if value and not SHA256_HEX.fullmatch(value):
        raise SignError(f"--syft-sha256 {value!r} is not a SHA-256 (64 lowercase hex digits)")


def pinned_syft(sha256: str) -> str:
    """The absolute path of the syft on PATH, once its binary's SHA-256 is ``sha256``."""
    found = shutil.which("syft")
    if found is None:
        raise SignError(f"syft is not on PATH, and --syft-sha256 asks for it: {NO_SYFT}")
    path = Path(found).resolve()
    digest = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as binary:
            while chunk := binary.read(1 << 20):
                size += len(chunk)
                if size > MAX_SYFT_BYTES:
                    limit = MAX_SYFT_BYTES >> 20
                    raise SignError(f"{path} is over {limit} MiB: not the pinned syft")
                digest.update(chunk)
    except OSError as exc:
        raise SignError(f"cannot read {path} to check its SHA-256: {exc}") from None
    if digest.hexdigest() != sha256:
        raise SignError(f"{path} has SHA-256 {digest.hexdigest()}, not the pinned {sha256}: "
                        "install the syft the workflow pins, or update --syft-sha256")  # fmt: skip
    return str(path)


def _attached(registry: Registry, repository: Repository, digest: str, suffix: str) -> bool:
    return registry.digest(repository.name, digest.replace(":", "-") + suffix) is not None


def _sign_one(signer: Signer, registry: Registry, digest: str, sbom: bool,
              scratch: Path) -> tuple[Status, str]:  # fmt: skip
    repository = signer.repository
    reference = f"{repository}@{digest}"
    done = []
    if not _attached(registry, repository, digest, ".sig"):
        signer.run(signer.sign_argv(reference))
        done.append("signature")
    if sbom and not _attached(registry, repository, digest, ".att"):
        predicate = scratch / f"{digest.replace(':', '-')}.spdx.json"
        signer.run(signer.sbom_argv(reference, predicate))
        signer.run(signer.attest_argv(reference, predicate))
        done.append("SBOM attestation")
    if not done:
        return Status.SKIPPED, "already signed" + (" and attested" if sbom else "")
    return Status.SIGNED, "added " + " and ".join(done)


def sign_images(
    matrix: Matrix,
    registry: Registry,
    signer: Signer,
    *,
    sbom: bool = True,
    syft_sha256: str = "",
    say: Callable[[str], None] = print,
) -> list[Signed]:
    """Sign (and attest) each published image of matrix once; one result per image. With
    syft_sha256, syft is checked first and a mismatch signs nothing (SignError)."""
    if sbom and syft_sha256:
        signer = replace(signer, syft=pinned_syft(syft_sha256))
    elif sbom and not commands.available("syft"):
        say(NO_SYFT)
        sbom = False
    results: list[Signed] = []
    seen: dict[str, Signed] = {}
    repository = signer.repository
    with tempfile.TemporaryDirectory(prefix="gdc-sbom.") as scratch:
        for image in matrix.images:
            tag = image.tags.tags[0]
            digest: str | None = None
            try:
                digest = registry.digest(repository.name, tag)
                if digest is None:
                    results.append(Signed(tag, "", Status.SKIPPED, "not in the registry"))
                    continue
                if digest in seen:
                    results.append(Signed(tag, digest, seen[digest].status,
                                          f"same image as {seen[digest].tag}"))  # fmt: skip
                    continue
                say(f"Signing {repository}:{tag} ({digest})")
                status, detail = _sign_one(signer, registry, digest, sbom, Path(scratch))
            except (DriverError, SignError) as exc:
                status, detail = Status.FAILED, str(exc)
            seen[digest or tag] = Signed(tag, digest or "", status, detail)
            results.append(seen[digest or tag])
    return results


def summary(results: Iterable[Signed], repository: Repository) -> str:
    rows = [(r.status.value, r.tag, r.digest[:19] or "-", r.detail) for r in results]
    table = format_table(("STATUS", "TAG", "DIGEST", "DETAIL"), rows)
    return f"Signatures in {repository}:\n{table}{counts(rows) or 'nothing published yet'}\n"
