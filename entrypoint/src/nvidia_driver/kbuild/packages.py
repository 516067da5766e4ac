"""Kernel interface packages: NVIDIA modules built for one exact kernel.

A package is a directory holding ``metadata.json`` and the files it names. It matches a node
only when its stored banner equals the node's ``/proc/version`` byte for byte: the banner
carries the compiler and the build timestamp, so one kernel version built twice is two kernels.

* open modules are stored linked (``.ko``);
* proprietary modules are stored as interface objects plus NVIDIA's core object and linked on
  the node with ``ld`` (linked proprietary modules are not redistributed).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from nvidia_driver.atomic import replacing
from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.log import say

FORMAT = 1
METADATA = "metadata.json"


def short_kernel(kernel_release: str) -> str:
    """``6.12.81-flatcar`` -> ``6.12.81``, as in NVIDIA's package names."""
    return kernel_release.split("-", 1)[0]


def package_name(kernel_release: str) -> str:
    return f"nvidia-modules-{short_kernel(kernel_release)}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class LinkedModule:
    """A proprietary module linked at install time from the objects listed in order."""

    module: str
    objects: list[str]
    linker_script: str = ""  # the kernel's scripts/module.lds, stored in the package


@dataclass(frozen=True)
class PackageMetadata:
    banner: str
    kernel_release: str
    driver_version: str
    module_type: str
    compiler: str
    # What it was built from: the module sources, patches and build code (the module sources
    # digest, build.module_sources_digest).
    source_digest: str
    modules: list[str]
    linked: list[LinkedModule] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    patches: list[str] = field(default_factory=list)
    flatcar_version: str = ""
    debug_info_stripped: bool = False
    format: int = FORMAT

    @property
    def name(self) -> str:
        return package_name(self.kernel_release)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PackageMetadata:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"unsupported package format {data.get('format')!r}")
        data["linked"] = [LinkedModule(**item) for item in data.get("linked", [])]
        return cls(**data)


@dataclass(frozen=True)
class Package:
    path: Path
    metadata: PackageMetadata

    @property
    def name(self) -> str:
        return self.metadata.name

    def matches(self, banner: str) -> bool:
        return self.metadata.banner == banner

    def damaged_file(self) -> str | None:
        """The first file of the package that is missing or does not match its SHA-256."""
        for name, expected in self.metadata.files.items():
            file = self.path / name
            if not file.is_file() or sha256_file(file) != expected:
                return name
        return None

    def verify(self) -> None:
        damaged = self.damaged_file()
        if damaged is not None:
            raise DriverError(
                f"package {self.path} is damaged: {damaged} is missing or does not match its "
                "checksum; delete the package (or pull the image again) so it is rebuilt"
            )


def load_package(path: Path) -> Package | None:
    try:
        metadata = PackageMetadata.from_json((path / METADATA).read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return Package(path, metadata)


def iter_packages(directories: Iterable[Path]) -> Iterator[Package]:
    for directory in directories:
        if not directory.is_dir():
            continue
        for metadata in sorted(directory.glob(f"**/{METADATA}")):
            package = load_package(metadata.parent)
            if package is not None:
                yield package


def matching_package(
    directories: Sequence[Path],
    banner: str,
    driver_version: str,
    module_type: str,
    *,
    source_digest: str | None = None,
) -> Package | None:
    """The first package built for this exact kernel banner, driver and module type.

    With ``source_digest``, only one built from exactly those module sources, patches and
    build code (build.module_sources_digest).
    """
    for package in iter_packages(directories):
        meta = package.metadata
        if (
            meta.driver_version == driver_version
            and meta.module_type == module_type
            and package.matches(banner)
            and source_digest in (None, meta.source_digest)
        ):
            return package
    return None


def report_match(package: Package | None) -> Package | None:
    if package is not None:
        say("kernel interface matches.")
        say(f"Found NVIDIA driver package {package.name}")
    return package


def write_package(destination: Path, metadata: PackageMetadata, files: dict[str, Path]) -> Package:
    """Write a package of files (by their name in it) atomically: a complete directory appears
    (in place of the package there before, if any), or nothing does."""
    with replacing(destination, directory=True) as staging:
        checksums = {}
        for name, source in files.items():
            shutil.copyfile(source, staging / name)
            checksums[name] = sha256_file(staging / name)
        final = replace(metadata, files=checksums)
        (staging / METADATA).write_text(final.to_json())
    return Package(destination, final)


def install_package(package: Package, modules_dir: Path, commands: Commands) -> list[str]:
    """Put the package's modules into ``modules_dir`` (the container's /lib/modules/<kernel>)."""
    say("Installing NVIDIA driver kernel modules...")
    package.verify()
    target = modules_dir / "kernel" / "drivers" / "video"
    with replacing(target, directory=True) as staging:
        for module in package.metadata.modules:
            shutil.copyfile(package.path / module, staging / module)
        for linked in package.metadata.linked:
            say(f"Linking {linked.module} from its kernel interface...")
            objects = [package.path / name for name in linked.objects]
            script: list[str | Path] = (
                ["-T", package.path / linked.linker_script] if linked.linker_script else []
            )
            commands.run(
                "ld", "-r", "--build-id=none", *script, "-o", staging / linked.module, *objects
            )
    # depmod wants these even when the container holds only the NVIDIA modules.
    for index in ("modules.order", "modules.builtin"):
        (modules_dir / index).touch()
    return [*package.metadata.modules, *(linked.module for linked in package.metadata.linked)]
