"""The versions file (versions.toml): supported drivers, their .run checksums, channels, arches."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSIONS_FILE = Path(__file__).resolve().parents[2] / "versions.toml"
ARCHES = ("amd64", "arm64")
CHANNELS = ("alpha", "beta", "stable", "lts")
# A checksum NVIDIA publishes but nobody has copied into the file yet.
UNKNOWN_CHECKSUM = "TODO"
_DRIVER_VERSION = re.compile(r"[0-9]{3,}\.[0-9]+(\.[0-9]+)?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FLATCAR_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")


class VersionsError(ValueError):
    """The versions file, or a version asked for, is not usable."""


def driver_branch(version: str) -> str:
    """``580.178.04`` -> ``580``: the branch the GPU Operator's precompiled tags carry."""
    if not _DRIVER_VERSION.fullmatch(version):
        raise VersionsError(f"invalid driver version {version!r}: expected e.g. 580.178.04")
    return version.split(".", 1)[0]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Driver:
    version: str
    sha256: Mapping[str, str | None]  # arch -> checksum of the .run; None: not recorded yet

    @property
    def branch(self) -> str:
        return driver_branch(self.version)

    def checksum(self, arch: str) -> str:
        """The recorded checksum of this driver's .run for arch, or a VersionsError saying why."""
        value = self.sha256.get(arch)
        if value is None:
            raise VersionsError(
                f"no SHA-256 recorded for NVIDIA-Linux-*-{self.version}.run on {arch}: copy it "
                "from NVIDIA's download page into versions.toml"
            )
        return value


@dataclass(frozen=True)
class Versions:
    drivers: tuple[Driver, ...]  # oldest first
    channels: tuple[str, ...]
    arches: tuple[str, ...]
    pinned: tuple[str, ...] = ()  # Flatcar versions covered besides the channels' current ones

    @property
    def newest(self) -> Driver:
        return self.drivers[-1]

    def driver(self, version: str) -> Driver:
        """The listed driver ``version`` (a bare branch such as ``580`` picks its newest)."""
        matches = [d for d in self.drivers if version in (d.version, d.branch)]
        if not matches:
            listed = ", ".join(d.version for d in self.drivers)
            raise VersionsError(
                f"driver {version} is not in versions.toml (listed: {listed}); add it there"
            )
        return matches[-1]


def load_versions(path: Path = VERSIONS_FILE) -> Versions:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise VersionsError(f"cannot read {path}: {exc}") from None
    return parse_versions(data, source=str(path))


def parse_versions(data: Mapping[str, Any], *, source: str = "versions.toml") -> Versions:
    images = data.get("images", {})
    channels = _names(images.get("channels", ["stable"]), CHANNELS, f"{source}: images.channels")
    arches = _names(images.get("arches", list(ARCHES)), ARCHES, f"{source}: images.arches")
    pinned = _pinned(images.get("pinned", []), f"{source}: images.pinned")
    drivers_table = data.get("drivers")
    if not isinstance(drivers_table, Mapping) or not drivers_table:
        raise VersionsError(f'{source}: no [drivers."<version>"] table')
    drivers = [_driver(version, entry, source) for version, entry in drivers_table.items()]
    drivers.sort(key=lambda driver: _version_key(driver.version))
    by_branch: dict[str, list[str]] = {}
    for driver in drivers:
        by_branch.setdefault(driver.branch, []).append(driver.version)
    doubled = {branch: listed for branch, listed in by_branch.items() if len(listed) > 1}
    if doubled:
        branch, listed = next(iter(doubled.items()))
        raise VersionsError(
            f"{source}: drivers {' and '.join(listed)} are both branch {branch}: keep one driver "
            "per branch (the usePrecompiled tags <branch>-<kernel>-flatcar<V> name the branch)"
        )
    return Versions(tuple(drivers), channels, arches, pinned)


def _names(value: object, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise VersionsError(f"{what} must be a non-empty list of names")
    unknown = [name for name in value if name not in allowed]
    if unknown:
        raise VersionsError(f"{what}: unknown {', '.join(unknown)} (known: {', '.join(allowed)})")
    return tuple(value)


def _pinned(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise VersionsError(f'{what} must be a list of Flatcar versions such as "4593.2.0"')
    bad = [version for version in value if not _FLATCAR_VERSION.fullmatch(version)]
    if bad:
        raise VersionsError(f"{what}: {', '.join(bad)} is not a Flatcar version such as 4593.2.0")
    return tuple(dict.fromkeys(value))


def _driver(version: str, entry: object, source: str) -> Driver:
    driver_branch(version)  # validates
    sums = entry.get("sha256", {}) if isinstance(entry, Mapping) else None
    if not isinstance(sums, Mapping):
        raise VersionsError(f"{source}: drivers.{version}.sha256 must be a table of arch = sum")
    checksums: dict[str, str | None] = {}
    for arch, value in sums.items():
        if arch not in ARCHES:
            raise VersionsError(f"{source}: drivers.{version}.sha256: unknown arch {arch!r}")
        checksums[arch] = _checksum(value, f"{source}: drivers.{version}.sha256.{arch}")
    return Driver(version, checksums)


def _checksum(value: object, what: str) -> str | None:
    if value == UNKNOWN_CHECKSUM:
        return None
    if not isinstance(value, str) or not _SHA256.fullmatch(value.lower()):
        raise VersionsError(f"{what}: expected 64 hex digits or {UNKNOWN_CHECKSUM!r}")
    return value.lower()
