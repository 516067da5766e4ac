"""Kernel interface packages: NVIDIA modules built for one exact kernel.

A package is a directory holding ``metadata.json`` and the files it names. It matches a node
only when its stored banner equals the node's ``/proc/version`` byte for byte: the banner
carries the compiler and the build timestamp, so one kernel version built twice is two kernels.

* open modules are stored linked (``.ko``);
* proprietary modules are stored as interface objects and linked on the node with ``ld``
  (linked proprietary modules are not redistributed) against NVIDIA's core objects. Those are
  referenced, not copied: the image already holds them, byte for byte, in the driver's module
  sources (/usr/src/nvidia-<version>), and a copy would make every precompiled image's layer
  64 MB larger. The package records each one's path there and SHA-256; one whose file is
  missing or differs is no match, and the node builds its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import typing
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from nvidia_driver.atomic import replacing
from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.log import say, warn
from nvidia_driver.naming import banner_release
from nvidia_driver.paths import Paths
from nvidia_driver.safetext import shown

FORMAT = 2
# Format 1 packages hold their core objects themselves (nothing referenced): still read.
READABLE_FORMATS = (1, 2)
METADATA = "metadata.json"
SHOWN_RELEASES = 3  # kernels named in a mismatch; the rest are counted
PATH_SHOWN = 400  # characters of a package's or a referenced file's path in a log line


def short_kernel(kernel_release: str) -> str:
    """``6.12.81-flatcar`` -> ``6.12.81``, as in NVIDIA's package names."""
    return kernel_release.split("-", 1)[0]


def package_name(kernel_release: str) -> str:
    return f"nvidia-modules-{short_kernel(kernel_release)}"


def sha256_file(path: Path) -> str:
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


@dataclass(frozen=True)
class LinkedModule:
    """A proprietary module linked at install time from the objects listed in order."""

    module: str
    objects: list[str]
    linker_script: str = ""  # the kernel's scripts/module.lds, stored in the package


def _fits(value: object, hint: Any) -> bool:
    """Whether a JSON value has the shape of a metadata field's type (str, list[str],
    dict[str, str], a dataclass...): metadata.json is a file on the node's disk, and a list where
    a mapping belongs is an unreadable package, not a traceback where it is used."""
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return isinstance(value, dict) and all(
            key in hints and _fits(item, hints[key]) for key, item in value.items()
        )
    kind, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if kind is list:
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value)
    if kind is dict:
        return isinstance(value, dict) and all(_fits(item, args[1]) for item in value.values())
    return isinstance(value, kind)


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
    # Every file by its name in the package, with its SHA-256, referenced ones included.
    files: dict[str, str] = field(default_factory=dict)
    # The files not copied in (NVIDIA's core objects), by their name in the package: their path
    # under the driver's module sources, /usr/src/nvidia-<driver_version>.
    referenced: dict[str, str] = field(default_factory=dict)
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
        if not _fits(data, cls):
            raise ValueError("not a package's metadata")
        if data.get("format") not in READABLE_FORMATS:
            raise ValueError(f"unsupported package format {data.get('format')!r}")
        data["linked"] = [LinkedModule(**item) for item in data.get("linked", [])]
        return cls(**data)


@dataclass(frozen=True)
class Package:
    path: Path
    metadata: PackageMetadata
    # Where the referenced files are: the driver's sources under the host root (Paths), else
    # (None) this container's own /usr/src/nvidia-<driver_version>.
    driver_sources: Path | None = None
    # Each file's verdict, once: init matches a package (its referenced core objects, 64 MB)
    # and then verifies every file before it links, so each would be hashed twice.
    _verdicts: dict[str, str | None] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @property
    def name(self) -> str:
        return self.metadata.name

    def matches(self, banner: str) -> bool:
        return self.metadata.banner == banner

    def file(self, name: str) -> Path:
        """Where the package's file ``name`` is: in the package, or in the driver's sources."""
        reference = self.metadata.referenced.get(name)
        if reference is None:
            return self.path / name
        version = self.metadata.driver_version
        return (self.driver_sources or Paths(Path("/")).driver_sources(version)) / reference

    def mismatch(self, name: str) -> str | None:
        """Why the file ``name`` cannot be used (missing, or not its SHA-256); None if it can."""
        if name not in self._verdicts:
            self._verdicts[name] = self._check(name)
        return self._verdicts[name]

    def _check(self, name: str) -> str | None:
        file = self.file(name)
        if not file.is_file():
            return f"{file} is missing"
        if sha256_file(file) != self.metadata.files.get(name):
            return f"{file} does not match the SHA-256 the package recorded"
        return None

    def unmatched_reference(self) -> str | None:
        """Why a file the package references in the driver's sources cannot be used."""
        return next(filter(None, map(self.mismatch, self.metadata.referenced)), None)

    def damaged_file(self) -> str | None:
        """The first file of the package that is missing or does not match its SHA-256."""
        return next((name for name in self.metadata.files if self.mismatch(name)), None)

    def verify(self) -> None:
        damaged = self.damaged_file()
        if damaged is not None:
            raise DriverError(
                f"package {self.path} is damaged: {damaged} is missing or does not match its "
                "checksum; delete the package (or pull the image again) so it is rebuilt"
            )


def load_package(path: Path, driver_sources: Path | None = None) -> Package | None:
    try:
        metadata = PackageMetadata.from_json((path / METADATA).read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return Package(path, metadata, driver_sources)


def _metadata_files(directories: Iterable[Path]) -> Iterator[Path]:
    for directory in directories:
        if directory.is_dir():
            yield from sorted(directory.glob(f"**/{METADATA}"))


def iter_packages(
    directories: Iterable[Path], driver_sources: Path | None = None
) -> Iterator[Package]:
    for metadata in _metadata_files(directories):
        package = load_package(metadata.parent, driver_sources)
        if package is not None:
            yield package


def matching_package(
    directories: Sequence[Path],
    banner: str,
    driver_version: str,
    module_type: str,
    driver_sources: Path,
    *,
    source_digest: str | None = None,
) -> Package | None:
    """The first package built for this exact kernel banner, driver and module type, whose
    referenced files are in ``driver_sources`` (/usr/src/nvidia-<driver_version>) as built.

    With ``source_digest``, only one built from exactly those module sources, patches and
    build code (build.module_sources_digest).
    """
    for package in iter_packages(directories, driver_sources):
        meta = package.metadata
        if (
            meta.driver_version == driver_version
            and meta.module_type == module_type
            and package.matches(banner)
            and source_digest in (None, meta.source_digest)
        ):
            unmatched = package.unmatched_reference()
            if unmatched is None:
                return package
            warn(f"package {shown(str(package.path), PATH_SHOWN)} does not fit this image's "
                 f"driver sources: {shown(unmatched, 2 * PATH_SHOWN)}")  # fmt: skip
    return None


def no_match_reason(directories: Sequence[Path], banner: str, driver_version: str,
             module_type: str, driver_sources: Path) -> str:  # fmt: skip
    """Why no package in directories serves this kernel, driver and module type, in a phrase:
    what a node's log and ``nvidia-driver status`` say before a runtime build."""
    packages = list(iter_packages(directories, driver_sources))
    if not packages:
        unreadable = next(_metadata_files(directories), None)
        return "the image carries no precompiled packages" if unreadable is None else (
            f"the image's packages cannot be read: {shown(str(unreadable), PATH_SHOWN)} is not "
            "a package's metadata")  # fmt: skip
    drivers = [p for p in packages if p.metadata.driver_version == driver_version]
    if not drivers:
        found = ", ".join(sorted({shown(p.metadata.driver_version, 40) for p in packages}))
        return f"the image's packages are for driver {found}, not {driver_version}"
    typed = [p for p in drivers if p.metadata.module_type == module_type]
    if not typed:
        found = ", ".join(sorted({shown(p.metadata.module_type, 40) for p in drivers}))
        return f"the image has {found} packages only, not {module_type}"
    matched = next((p for p in typed if p.matches(banner)), None)
    if matched is not None:  # unused: other driver sources, or damaged (Pipeline.precompiled)
        damaged = matched.damaged_file() if matched.unmatched_reference() is None else None
        why = "does not fit the image's driver sources" if damaged is None else (
            f"is damaged: {shown(str(matched.file(damaged)), 2 * PATH_SHOWN)} is missing or "
            "does not match its SHA-256")  # fmt: skip
        return f"its package for this kernel {why}"
    release = _release(banner)
    if any(_release(p.metadata.banner) == release for p in typed):
        return (f"its package for kernel {release} was built for another build of it: the "
                "node's /proc/version differs from the package's")  # fmt: skip
    releases = sorted({_release(p.metadata.banner) for p in typed})
    shown_releases = ", ".join(releases[:SHOWN_RELEASES])
    more = f" and {len(releases) - SHOWN_RELEASES} more" if len(releases) > SHOWN_RELEASES else ""
    return f"the image's {module_type} packages are for other kernels: {shown_releases}{more}"


def _release(banner: str) -> str:
    """The release a package's banner names, fit for a log line (metadata.json is a file on
    the node: its words are escaped)."""
    try:
        return shown(banner_release(banner), 80)
    except DriverError:
        return shown(banner, 80)


def report_match(package: Package | None) -> Package | None:
    if package is not None:
        say("kernel interface matches.")
        say(f"Found NVIDIA driver package {package.name}")
    return package


def write_package(
    destination: Path,
    metadata: PackageMetadata,
    files: dict[str, Path],
    driver_sources: Path | None = None,
) -> Package:
    """Write a package of files (by their name in it) atomically: a complete directory appears
    (in place of the package there before, if any), or nothing does. The files metadata
    references are not copied: their SHA-256s are taken in ``driver_sources``."""
    package = Package(destination, metadata, driver_sources)
    with replacing(destination, directory=True) as staging:
        checksums = {}
        for name, source in files.items():
            shutil.copyfile(source, staging / name)
            checksums[name] = sha256_file(staging / name)
        for name in metadata.referenced:
            checksums[name] = sha256_file(package.file(name))
        final = replace(metadata, files=checksums)
        (staging / METADATA).write_text(final.to_json())
    return replace(package, metadata=final)


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
            objects = [package.file(name) for name in linked.objects]
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
