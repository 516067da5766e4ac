"""Image-build steps: fetch NVIDIA's driver and fabric manager, verify them, install them.

images/build/Dockerfile runs these, and only these::

    python3 -m nvidia_driver.provision driver --arch amd64 --base-url URL --version V --sha256 SUM
    python3 -m nvidia_driver.provision fabricmanager --arch amd64 --base-url URL --version V

``driver`` downloads ``<base>/<V>/NVIDIA-Linux-<x86_64|aarch64>-<V>.run``, checks its SHA-256
(one digest, or ``amd64=HEX,arm64=HEX`` so that one multi-arch build passes both) and hands it to
``python3 -m nvidia_driver.userspace install``; the .run is deleted in the same step, so it never
lands in an image layer.

``fabricmanager`` reads ``<base>/redistrib_<V>.json``, NVIDIA's manifest of redistributable
archives, and installs the ``fabricmanager`` archive (and ``nvlsm`` where the branch has one),
each verified against the manifest's SHA-256::

    <base>/fabricmanager/linux-<x86_64|sbsa>/fabricmanager-linux-<x86_64|sbsa>-<V>-archive.tar.xz

The archive's ``bin/`` and ``sbin/`` go to /usr/bin, ``lib/`` to /usr/lib/<triplet>, ``share/`` to
/usr/share, and ``etc/<file>`` to /usr/share/nvidia/<nvswitch|nvlsm>/ where the entrypoint reads
its configuration (fabricmanager.cfg, nvlsm.conf). Headers and systemd units are left out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from nvidia_driver.errors import DriverError
from nvidia_driver.log import say

RUN_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}
REDIST_ARCH = {"amd64": "x86_64", "arm64": "sbsa"}
TRIPLET = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
CHUNK = 1 << 20
ATTEMPTS = 4
FIRST_DELAY_SECONDS = 2.0
TIMEOUT_SECONDS = 120
SHA256_HEX_LENGTH = 64
USER_AGENT = "gpu-driver-container image build"
USER_AGENT = "gpu-driver-container image build"

# Redistributable components: (manifest key, required, directory of its etc/ files).
FABRICMANAGER = ("fabricmanager", True, "nvswitch")
NVLSM = ("nvlsm", False, "nvlsm")
COMPONENTS = (FABRICMANAGER, NVLSM)
REQUIRED_FILES = {
    "fabricmanager": ("usr/bin/nv-fabricmanager", "usr/share/nvidia/nvswitch/fabricmanager.cfg"),
}
SKIPPED_TOP_DIRS = frozenset({"include", "systemd", "docs", "doc", "pkgconfig"})


def _arch(arch: str) -> str:
    if arch not in RUN_ARCH:
        raise DriverError(f"unsupported architecture {arch!r}: expected amd64 or arm64")
    return arch


def checksum_for(spec: str, arch: str) -> str:
    """The digest for ``arch`` from ``HEX`` or ``amd64=HEX,arm64=HEX``."""
    spec = spec.strip()
    if "=" not in spec:
        return _valid_sha256(spec, f"--sha256 {spec!r}")
    sums = {}
    for item in spec.split(","):
        name, _, digest = item.strip().partition("=")
        sums[name.strip()] = digest.strip()
    if arch not in sums:
        raise DriverError(f"--sha256 lists no checksum for {arch} (it lists {', '.join(sums)})")
    return _valid_sha256(sums[arch], f"--sha256 for {arch}")


def _valid_sha256(digest: str, what: str) -> str:
    lowered = digest.lower()
    if len(lowered) != SHA256_HEX_LENGTH or any(c not in "0123456789abcdef" for c in lowered):
        raise DriverError(
            f"{what} is not a SHA-256 (64 hex digits); record the .run's checksum in "
            "versions.toml or pass --driver-sha256 to invoke build"
        )
    return lowered


def driver_url(base_url: str, version: str, arch: str) -> str:
    return f"{base_url.rstrip('/')}/{version}/NVIDIA-Linux-{RUN_ARCH[_arch(arch)]}-{version}.run"


def redist_manifest_url(base_url: str, version: str) -> str:
    return f"{base_url.rstrip('/')}/redistrib_{version}.json"


# --- downloads ---------------------------------------------------------------------------------


def download(url: str, destination: Path, sha256: str | None = None) -> str:
    """Fetch url into destination (retrying network failures); return and check its SHA-256."""
    delay = FIRST_DELAY_SECONDS
    for attempt in range(1, ATTEMPTS + 1):
        try:
            digest = _download_once(url, destination)
            break
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == ATTEMPTS:  # noqa: PLR2004 - server errors retry
                raise DriverError(f"cannot download {url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            missing = isinstance(getattr(exc, "reason", exc), FileNotFoundError)
            if missing or attempt == ATTEMPTS:  # a missing file stays missing
                raise DriverError(f"cannot download {url}: {exc}") from None
        say(f"Retrying {url} in {delay:.0f}s (attempt {attempt} of {ATTEMPTS} failed)")
        time.sleep(delay)
        delay *= 2
    if sha256 is not None and digest != sha256:
        destination.unlink(missing_ok=True)
        raise DriverError(
            f"{PurePosixPath(url).name}: expected SHA-256 {sha256}, got {digest} (from {url}): "
            "the download is damaged or the recorded checksum is wrong; nothing was installed"
        )
    return digest


def _download_once(url: str, destination: Path) -> str:
    if not url.startswith(("https://", "http://", "file://")):
        raise DriverError(f"refusing to download {url!r}: not an http(s) or file URL")
    digest = hashlib.sha256()
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})  # noqa: S310
    with (
        urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response,  # noqa: S310
        destination.open("wb") as out,
    ):
        for chunk in iter(lambda: response.read(CHUNK), b""):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _read_json(url: str, scratch: Path) -> Any:
    path = scratch / PurePosixPath(url).name
    download(url, path)
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DriverError(f"{url} is not a JSON manifest: {exc}") from None


# --- driver ------------------------------------------------------------------------------------

Runner = Callable[[Sequence[str]], None]


def _run(argv: Sequence[str]) -> None:
    result = subprocess.run(list(argv), check=False)
    if result.returncode != 0:
        raise DriverError(f"{' '.join(argv)} exited {result.returncode}")


def install_driver(
    *,
    base_url: str,
    version: str,
    arch: str,
    sha256_spec: str,
    root: Path,
    runner: Runner = _run,
) -> None:
    expected = checksum_for(sha256_spec, _arch(arch))
    url = driver_url(base_url, version, arch)
    with tempfile.TemporaryDirectory(prefix="nvidia-run.") as scratch:
        runfile = Path(scratch) / PurePosixPath(url).name
        say(f"Downloading {url}")
        download(url, runfile, expected)
        say(f"Verified {runfile.name} (sha256 {expected})")
        runner(
            [sys.executable, "-m", "nvidia_driver.userspace", "install", "--run", str(runfile),
             "--sha256", expected, "--root", str(root), "--arch", arch]
        )  # fmt: skip


# --- fabric manager ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RedistArchive:
    component: str
    version: str
    relative_path: str
    sha256: str
    etc_dir: str

    def url(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/{self.relative_path}"


def redist_archives(manifest: Mapping[str, Any], arch: str, version: str) -> list[RedistArchive]:
    """The archives to install for arch: fabric manager always, NVLSM when the manifest has it."""
    platform = f"linux-{REDIST_ARCH[_arch(arch)]}"
    archives = []
    for key, required, etc_dir in COMPONENTS:
        entry = manifest.get(key)
        if not isinstance(entry, Mapping):
            if required:
                raise DriverError(
                    f"redistrib_{version}.json lists no {key}: NVIDIA publishes it per driver "
                    "release; check the driver version and FABRICMANAGER_BASE_URL"
                )
            continue
        if key == "fabricmanager" and str(entry.get("version")) != version:
            raise DriverError(
                f"redistrib_{version}.json has fabric manager {entry.get('version')}, not "
                f"{version}: the fabric manager must match the driver exactly"
            )
        files = entry.get(platform)
        if not isinstance(files, Mapping):
            if required:
                raise DriverError(f"redistrib_{version}.json has no {key} for {platform}")
            continue
        relative_path = str(files.get("relative_path", ""))
        sha256 = _valid_sha256(str(files.get("sha256", "")), f"{key} {platform} sha256")
        _safe_relative(relative_path, f"{key} relative_path")
        archives.append(
            RedistArchive(key, str(entry.get("version", "")), relative_path, sha256, etc_dir)
        )
    return archives


def _safe_relative(path: str, what: str) -> PurePosixPath:
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts:
        raise DriverError(f"{what} {path!r} is not a plain relative path")
    return pure


def install_fabricmanager(*, base_url: str, version: str, arch: str, root: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="nvidia-redist.") as scratch_name:
        scratch = Path(scratch_name)
        manifest_url = redist_manifest_url(base_url, version)
        say(f"Reading {manifest_url}")
        manifest = _read_json(manifest_url, scratch)
        if not isinstance(manifest, Mapping):
            raise DriverError(f"{manifest_url} is not a redistrib manifest (not an object)")
        for archive in redist_archives(manifest, arch, version):
            url = archive.url(base_url)
            say(f"Downloading {archive.component} {archive.version}: {url}")
            path = scratch / PurePosixPath(archive.relative_path).name
            download(url, path, archive.sha256)
            installed = install_archive(path, root, archive.etc_dir, TRIPLET[arch])
            say(f"Installed {archive.component} {archive.version}: {len(installed)} files")
            path.unlink()
            _check_installed(root, archive.component)


def _check_installed(root: Path, component: str) -> None:
    missing = [name for name in REQUIRED_FILES.get(component, ()) if not (root / name).exists()]
    if missing:
        raise DriverError(f"the {component} archive lacks {', '.join(missing)}: wrong archive?")


def destination_of(member: PurePosixPath, etc_dir: str, triplet: str) -> PurePosixPath | None:
    """Where a file of the archive (without its top directory) goes; None: not installed."""
    if not member.parts:
        return None
    top, rest = member.parts[0], member.parts[1:]
    if not rest:
        return PurePosixPath("usr/share/doc/nvidia-redist", top)  # LICENSE, notices
    if top in SKIPPED_TOP_DIRS:
        return None
    targets = {
        "bin": PurePosixPath("usr/bin"),
        "sbin": PurePosixPath("usr/bin"),
        "lib": PurePosixPath("usr/lib", triplet),
        "lib64": PurePosixPath("usr/lib", triplet),
        "share": PurePosixPath("usr/share"),
        "etc": PurePosixPath("usr/share/nvidia", etc_dir),
    }
    base = targets.get(top)
    return None if base is None else base.joinpath(*rest)


def install_archive(archive: Path, root: Path, etc_dir: str, triplet: str) -> list[PurePosixPath]:
    """Install a redist .tar.xz under root; members are checked, never extracted blindly."""
    installed = []
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            name = _safe_relative(member.name.removeprefix("./"), "archive member")
            if len(name.parts) < 2 or member.isdir():  # noqa: PLR2004 - <top>/<file>
                continue
            target = destination_of(PurePosixPath(*name.parts[1:]), etc_dir, triplet)
            if target is None:
                continue
            _install_member(tar, member, root / target)
            installed.append(target)
    return installed


def _install_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.exists():
        dest.unlink()
    if member.issym():
        # Library aliases (libnvfm.so -> libnvfm.so.1) stay within their directory.
        if "/" in member.linkname:
            raise DriverError(f"archive symlink {member.name} -> {member.linkname} leaves its dir")
        dest.symlink_to(member.linkname)
        return
    if not member.isfile():
        raise DriverError(f"archive member {member.name} is neither a file nor a symlink")
    source = tar.extractfile(member)
    if source is None:
        raise DriverError(f"cannot read {member.name} from the archive")
    with source, dest.open("wb") as out:
        shutil.copyfileobj(source, out, CHUNK)
    dest.chmod(0o755 if member.mode & 0o111 else 0o644)


# --- command line ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python3 -m nvidia_driver.provision",
        description="Image-build steps: install NVIDIA's driver and fabric manager, verified.",
    )
    steps = main.add_subparsers(dest="step", required=True)
    for name, help_text in (
        ("driver", "download the .run, verify it and install its userspace"),
        ("fabricmanager", "install the fabric manager (and NVLSM) from NVIDIA's redist archives"),
    ):
        step = steps.add_parser(name, help=help_text, description=help_text)
        step.add_argument("--arch", required=True, choices=sorted(RUN_ARCH))
        step.add_argument("--base-url", required=True, metavar="URL")
        step.add_argument("--version", required=True, metavar="V")
        step.add_argument("--root", type=Path, default=Path("/"), metavar="DIR")
        if name == "driver":
            step.add_argument("--sha256", required=True, metavar="HEX|ARCH=HEX,...")
    return main


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.step == "driver":
            install_driver(
                base_url=args.base_url,
                version=args.version,
                arch=args.arch,
                sha256_spec=args.sha256,
                root=args.root,
            )
        else:
            install_fabricmanager(
                base_url=args.base_url, version=args.version, arch=args.arch, root=args.root
            )
    except DriverError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
