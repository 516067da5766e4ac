"""NVIDIA's download tree, laid out under a directory for fetch_server.ReleaseServer.

The paths and file formats are NVIDIA's (tooling/gdc/nvidia.py cites each)::

    XFree86/Linux-<x86_64|aarch64>/<version>/NVIDIA-Linux-<arch>-<version>.run.sha256sum
    tesla/<version>/NVIDIA-Linux-<arch>-<version>.run
    compute/nvidia-driver/redist/redistrib_<version>.json
    datacenter/tesla/drivers/releases.json

The content carries only what the repository knows about NVIDIA's real files: the checksums
versions.toml records (from nixpkgs and the AUR, which it cites). A redistrib manifest lists a
component only where versions.toml records its digests; the real manifests list more (the
driver itself, and whichever of NVLSM, IMEX and NVSDM NVIDIA pairs with it) with digests no
public source gives, so the fixture leaves them out rather than make them up. Stand-ins, where
a test needs a file's bytes (a .run for --verify), are named so and their digests computed from
their stand-in bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fetch_server import ReleaseServer

from gdc.nvidia import NvidiaUpstream
from gdc.versions import VERSIONS_FILE, Driver, load_versions
from nvidia_driver.naming import ARCHES, MACHINE, redist_platform, run_name

# The repository's versions.toml: the drivers whose files the tree carries.
TODAY_TEXT = VERSIONS_FILE.read_text()
TODAY = load_versions()

PLATFORM = {arch: redist_platform(arch) for arch in ARCHES}
CHECKSUMS = "XFree86"
TESLA = "tesla"
REDIST = "compute/nvidia-driver/redist"
RELEASES = "datacenter/tesla/drivers/releases.json"
# The hosts a test trusts in place of NVIDIA's (the server listens on 127.0.0.1 only).
TRUST_LOOPBACK = {"NVIDIA_DRIVER_REDIRECT_HOSTS": "127.0.0.1"}


# The AUR nvlsm PKGBUILD at pkgver 2025.06.11: sha256sums_x86_64 and sha256sums_aarch64 of
# NVIDIA's nvlsm-linux-<x86_64|sbsa>-2025.06.11-archive.tar.xz. Which driver's manifest lists
# this NVLSM is not public: the tests pair it only with stand-in releases.
NVLSM_AUR = (
    "2025.06.11",
    "251296a10538ebb6acee3e0f835f5a3bf0eea7521e8c130a593cd263691ef935",
    "0178f31beee1f7b144af147a3234505b03f1bb38cf9d8460bd6c65107f66b8f2",
)
STAND_IN = "999.1.1"  # a release no NVIDIA branch has: the tests' own files


def todo_entry(version: str) -> str:
    """A versions.toml entry whose checksums nobody recorded yet."""
    return f'[drivers."{version}"]\nsha256.amd64 = "TODO"\nsha256.arm64 = "TODO"\n'


def upstream(server: ReleaseServer) -> NvidiaUpstream:
    return NvidiaUpstream(
        server.url(CHECKSUMS), server.url(TESLA), server.url(REDIST), server.url(RELEASES)
    )


def sha256sum_line(sha256: str, name: str) -> str:
    """As ``sha256sum`` writes it, and as NVIDIA's files read: '<hex>  <name>'."""
    return f"{sha256}  {name}\n"


def write_checksum(root: Path, version: str, arch: str, text: str) -> Path:
    path = (
        root
        / CHECKSUMS
        / f"Linux-{MACHINE[arch]}"
        / version
        / f"{run_name(version, arch)}.sha256sum"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def manifest_of(driver: Driver) -> dict[str, Any]:
    """redistrib_<version>.json with the components versions.toml records for driver."""
    manifest: dict[str, Any] = {"release_label": driver.version, "release_product": "nvidia-driver"}
    for archive in driver.redist:
        platforms = {
            PLATFORM[arch]: {
                "relative_path": (
                    f"{archive.component}/{PLATFORM[arch]}/{archive.component}-"
                    f"{PLATFORM[arch]}-{archive.version}-archive.tar.xz"
                ),
                "sha256": digest,
            }
            for arch, digest in archive.sha256.items()
            if digest is not None
        }
        if archive.version is not None and platforms:
            manifest[archive.component] = {"version": archive.version, **platforms}
    return manifest


def write_manifest(root: Path, version: str, manifest: dict[str, Any]) -> Path:
    path = root / REDIST / f"redistrib_{version}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=4))
    return path


def lay_out(root: Path, driver: Driver) -> None:
    """NVIDIA's files for a driver versions.toml records."""
    for arch, digest in driver.sha256.items():
        assert digest is not None, f"versions.toml records no .run digest for {arch}"
        write_checksum(
            root, driver.version, arch, sha256sum_line(digest, run_name(driver.version, arch))
        )
    write_manifest(root, driver.version, manifest_of(driver))


def listed(key: str, version: str, digests: dict[str, str]) -> dict[str, object]:
    """A component of redistrib_<version>.json: its version and an archive per platform."""
    return {
        "version": version,
        **{
            platform: {
                "relative_path": f"{key}/{platform}/{key}-{platform}-{version}-archive.tar.xz",
                "sha256": digest,
            }
            for platform, digest in digests.items()
        },
    }


def stand_in_run(root: Path, version: str, arch: str) -> str:
    """A stand-in .run in the tesla tree with its .sha256sum; its SHA-256 (not NVIDIA's)."""
    data = f"stand-in for {run_name(version, arch)}, not NVIDIA's file\n".encode()
    path = root / TESLA / version / run_name(version, arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    write_checksum(root, version, arch, sha256sum_line(digest, run_name(version, arch)))
    return digest


# NVIDIA's releases.json, the branches and releases of the live file as one public capture of
# it recorded them on 2026-09-28 (tests/fixtures/n2/collectors/nvidia-datacenter-drivers/
# releases.json in 2009seungbin-stack/my-first-repo, "a 4-branch excerpt of the live file"):
# its layout, type names, dates and URLs. Each release's architectures and runfile_url are as
# there: x86_64 and aarch64 under us.download.nvidia.com/tesla/<version>/.
_RELEASES = {  # branch -> (type, [(version, date), ...] newest first)
    "615": ("new feature branch", [("615.71.09", "2026-09-09")]),
    "595": (
        "production branch",
        [("595.91.07", "2026-08-03"), ("595.71.05", "2026-04-28"), ("595.58.03", "2026-03-24")],
    ),
    "580": (
        "lts branch",
        [("580.178.04", "2026-08-03"), ("580.173.02", "2026-06-29"), ("580.65.06", "2025-08-04")],
    ),
    "460": ("production branch", [("460.106.00", "2021-10-26"), ("460.32.03", "")]),
}


def releases_json() -> dict[str, Any]:
    feed: dict[str, Any] = {}
    for branch, (kind, releases) in _RELEASES.items():
        infos = []
        for version, date in releases:
            arches = ["x86_64", "aarch64", *(["ppc64le"] if branch == "460" else [])]
            infos.append(
                {
                    "release_version": version,
                    "release_date": date,
                    "release_notes": "https://docs.nvidia.com/datacenter/tesla/tesla-release-notes-"
                    f"{version.replace('.', '-')}/index.html",
                    "architectures": arches,
                    "runfile_url": {
                        arch: f"https://us.download.nvidia.com/tesla/{version}/"
                        f"NVIDIA-Linux-{arch}-{version}.run"
                        for arch in arches
                    },
                }
            )
        feed[branch] = {"type": kind, "driver_info": infos}
    return feed


def write_releases(root: Path, feed: dict[str, Any] | None = None) -> Path:
    path = root / RELEASES
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(releases_json() if feed is None else feed, indent=1))
    return path
