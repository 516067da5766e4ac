"""Image-build steps: fetch NVIDIA's driver and redist archives, verify them, install them.

images/build/Dockerfile runs these, and only these::

    python3 -m nvidia_driver.image.provision driver --arch amd64 --base-url URL --version V \
        --sha256 SUM
    python3 -m nvidia_driver.image.provision redist --arch amd64 --base-url URL --version V \
        --sha256 fabricmanager.amd64=HEX,libnvidia_nscq.amd64=HEX,...
    python3 -m nvidia_driver.image.provision verify --arch amd64 --version V

``driver`` downloads ``<base>/<V>/NVIDIA-Linux-<x86_64|aarch64>-<V>.run``, checks its SHA-256
(one digest, or ``amd64=HEX,arm64=HEX`` so that one multi-arch build passes both) and installs
its userspace (image/userspace.py, without man pages); the .run is deleted in the same step, so
it never lands in an image layer.

``redist`` reads ``<base>/redistrib_<V>.json``, NVIDIA's manifest of redistributable archives,
and installs the fabric manager, NSCQ, NVLSM, IMEX and NVSDM archives it lists (sources/redist.py),
each verified against the manifest's SHA-256 and the one recorded in the repository.

``verify`` checks the finished driver root against driver-root.toml (driverroot.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from nvidia_driver.commands import Commands
from nvidia_driver.digests import ANY, digest_list
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import jsontext
from nvidia_driver.image.driverroot import ldconfig_root, verify_root
from nvidia_driver.image.userspace import install_runfile
from nvidia_driver.log import say
from nvidia_driver.naming import ARCHES, driver_url, known_arch, redist_manifest_url
from nvidia_driver.settings import NVIDIA_DRIVER_REDIRECT_HOSTS
from nvidia_driver.sources import redist
from nvidia_driver.sources.download import Downloader, DownloadLimits, Opened

# redistrib_<V>.json is a few kB (about twenty components); far past that it is not one.
MAX_MANIFEST_BYTES = 4 << 20

# What each archive must have installed: the paths init and its start scripts run or read.
REQUIRED_FILES = {
    "fabricmanager": (
        "usr/bin/nv-fabricmanager",
        "usr/bin/nvidia-fabricmanager-start.sh",
        "usr/share/nvidia/nvswitch/fabricmanager.cfg",
    ),
    "nvlsm": (f"{redist.NVLSM_HOME}/sbin/nvlsm", f"{redist.NVLSM_CONFIG_DIR}/nvlsm.conf"),
    "imex": ("usr/bin/nvidia-imex", "usr/bin/nvidia-imex-ctl", "etc/nvidia-imex/config.cfg"),
}


def checksum_for(spec: str, arch: str) -> str:
    """The digest for ``arch`` from ``HEX`` or ``amd64=HEX,arm64=HEX``."""
    try:
        sums = digest_list(spec, "--sha256")
    except DriverError as exc:
        raise DriverError(
            f"{exc}; record the .run's checksum in versions.toml or pass --driver-sha256 to "
            "invoke build"
        ) from None
    if ANY in sums:
        return sums[ANY]
    if arch not in sums:
        raise DriverError(f"--sha256 lists no checksum for {arch} (it lists {', '.join(sums)})")
    return sums[arch]


# --- downloads ---------------------------------------------------------------------------------

# NVIDIA's download hosts (us.download.nvidia.com, developer.download.nvidia.com): a redirect
# among them is followed, any other refused (NVIDIA_DRIVER_REDIRECT_HOSTS overrides the list).
NVIDIA_REDIRECT_HOSTS = ("download.nvidia.com", "*.download.nvidia.com")
NVIDIA_MISSING = "no such NVIDIA driver release or archive; check the driver version and base URL"


def downloader(
    env: Mapping[str, str] | None = None, hosts: tuple[str, ...] = NVIDIA_REDIRECT_HOSTS
) -> Downloader:
    """Bounded downloads (sources/download.py): deadline, minimum rate, redirects to hosts
    (or to those NVIDIA_DRIVER_REDIRECT_HOSTS names)."""
    env = os.environ if env is None else env
    limits = DownloadLimits.from_env(env)
    if not env.get(NVIDIA_DRIVER_REDIRECT_HOSTS, "").strip():
        limits = dataclasses.replace(limits, redirect_hosts=hosts)
    return Downloader(limits, missing=NVIDIA_MISSING)


def download(
    url: str, destination: Path, sha256: str | None = None, via: Downloader | None = None
) -> str:
    """Fetch url into destination within the download limits; return and check its SHA-256."""

    def write(opened: Opened) -> str:
        return opened.save_to(destination, hashlib.sha256())

    try:
        digest = (via or downloader()).transfer(url, write)
    except DriverError as exc:
        destination.unlink(missing_ok=True)
        raise DriverError(f"cannot download {url}: {exc}") from None
    if sha256 is not None and digest != sha256:
        destination.unlink(missing_ok=True)
        raise DriverError(
            f"{PurePosixPath(url).name}: expected SHA-256 {sha256}, got {digest} (from {url}): "
            "the download is damaged or the recorded checksum is wrong; nothing was installed"
        )
    return digest


def _read_json(url: str) -> Any:
    try:
        body = downloader().get_small(url, MAX_MANIFEST_BYTES, "a redistrib manifest")
    except DriverError as exc:
        raise DriverError(f"cannot download {url}: {exc}") from None
    return jsontext.parse(body, url, "it should be a JSON manifest")


# --- driver ------------------------------------------------------------------------------------


def install_driver(*, base_url: str, version: str, arch: str, sha256_spec: str, root: Path) -> None:
    expected = checksum_for(sha256_spec, known_arch(arch))
    url = driver_url(base_url, version, arch)
    with tempfile.TemporaryDirectory(prefix="nvidia-run.") as scratch:
        runfile = Path(scratch) / PurePosixPath(url).name
        say(f"Downloading {url}")
        download(url, runfile, expected)
        say(f"Verified {runfile.name} (sha256 {expected})")
        # No man pages: the image has none (images/build/dpkg/gdc-slim), and the container
        # toolkit injects programs and libraries only.
        install_runfile(runfile, root, arch=arch, sha256=expected, man_pages=False)


# --- redist archives ----------------------------------------------------------------------------


def install_redist(
    *, base_url: str, version: str, arch: str, sha256_spec: str, root: Path
) -> list[redist.Archive]:
    """Install every archive redistrib_<version>.json lists for arch, each verified twice."""
    recorded = redist.recorded_digests(sha256_spec)
    with tempfile.TemporaryDirectory(prefix="nvidia-redist.") as scratch_name:
        scratch = Path(scratch_name)
        manifest_url = redist_manifest_url(base_url, version)
        say(f"Reading {manifest_url}")
        manifest = _read_json(manifest_url)
        if not isinstance(manifest, Mapping):
            raise DriverError(f"{manifest_url} is not a redistrib manifest (not an object)")
        listed = redist.listed_archives(manifest, known_arch(arch), version)
        # Every digest is known before anything is downloaded; unrecorded optional ones are
        # left out (expected_digest says so).
        expected: dict[str, str] = {}
        for archive in listed:
            digest = redist.expected_digest(archive, arch, recorded, version)
            if digest is not None:
                expected[archive.component.key] = digest
        archives = [archive for archive in listed if archive.component.key in expected]
        for archive in archives:
            url = f"{base_url.rstrip('/')}/{archive.relative_path}"
            say(f"Downloading {archive.component.title} {archive.version}: {url}")
            path = scratch / archive.file_name
            download(url, path, expected[archive.component.key])
            installed = redist.install_archive(path, archive, root, arch)
            say(f"Installed {archive.component.title} {archive.version}: {len(installed)} files")
            path.unlink()
            if archive.component is redist.NVLSM:
                redist.link_nvlsm_config(root)
            _check_installed(root, archive.component.key)
    # SONAME links (libnvidia-nscq.so.2) come from ldconfig, as nvidia-installer's do.
    Commands().run("ldconfig", *ldconfig_root(root))
    return archives


def _check_installed(root: Path, component: str) -> None:
    missing = [name for name in REQUIRED_FILES.get(component, ()) if not (root / name).exists()]
    if missing:
        raise DriverError(f"the {component} archive lacks {', '.join(missing)}: wrong archive?")


def verify(*, version: str, arch: str, root: Path) -> None:
    verify_root(root, known_arch(arch), version, Commands())


# --- command line ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python3 -m nvidia_driver.image.provision",
        description="Image-build steps: install NVIDIA's driver and redist archives, verified.",
    )
    steps = main.add_subparsers(dest="step", required=True)
    for name, help_text in (
        ("driver", "download the .run, verify it and install its userspace"),
        ("redist", "install the fabric manager, NSCQ, NVLSM, IMEX and NVSDM archives, verified"),
        ("verify", "check the driver root against the names the container toolkit injects"),
    ):
        step = steps.add_parser(name, help=help_text, description=help_text)
        step.add_argument("--arch", required=True, choices=ARCHES)
        if name != "verify":
            step.add_argument("--base-url", required=True, metavar="URL")
        step.add_argument("--version", required=True, metavar="V")
        step.add_argument("--root", type=Path, default=Path("/"), metavar="DIR")
        if name == "driver":
            step.add_argument("--sha256", required=True, metavar="HEX|ARCH=HEX,...")
        if name == "redist":
            step.add_argument(
                "--sha256", required=True, metavar="COMPONENT.ARCH=HEX,...",
                help="the archives' SHA-256s recorded in versions.toml",
            )  # fmt: skip
    return main


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.step == "verify":
            verify(version=args.version, arch=args.arch, root=args.root)
        else:
            install = install_driver if args.step == "driver" else install_redist
            install(
                base_url=args.base_url,
                version=args.version,
                arch=args.arch,
                sha256_spec=args.sha256,
                root=args.root,
            )
    except DriverError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
