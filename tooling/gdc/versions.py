"""The versions file (versions.toml): drivers, their .run and redist checksums, channels, arches."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvidia_driver.digests import valid_sha256
from nvidia_driver.errors import DriverError
from nvidia_driver.naming import ARCHES, FLATCAR_VERSION_RE, driver_key
from nvidia_driver.naming import driver_branch as _branch

VERSIONS_FILE = Path(__file__).resolve().parents[2] / "versions.toml"
CHANNELS = ("alpha", "beta", "stable", "lts")
# A checksum NVIDIA publishes but nobody has copied into the file yet.
UNKNOWN_CHECKSUM = "TODO"
_COMPONENT = re.compile(r"[a-z][a-z0-9_]*")


class VersionsError(ValueError):
    """The versions file, or a version asked for, is not usable."""


def driver_branch(version: str) -> str:
    """``580.178.04`` -> ``580``: the branch the GPU Operator's precompiled tags carry, as text
    and refused as a VersionsError."""
    try:
        return str(_branch(version))
    except DriverError as exc:
        raise VersionsError(str(exc)) from None


@dataclass(frozen=True)
class RedistDigests:
    """One redist archive of a driver (redistrib_<driver>.json): its version and SHA-256s."""

    component: str  # the manifest key: fabricmanager, libnvidia_nscq, nvlsm, imex, libnvsdm
    version: str | None  # None: not recorded yet
    sha256: Mapping[str, str | None]  # arch -> checksum; None: not recorded yet


@dataclass(frozen=True)
class Driver:
    version: str
    sha256: Mapping[str, str | None]  # arch -> checksum of the .run; None: not recorded yet
    redist: tuple[RedistDigests, ...] = ()

    @property
    def branch(self) -> str:
        return driver_branch(self.version)

    def checksum(self, arch: str) -> str:
        """The recorded checksum of this driver's .run for arch, or a VersionsError saying why."""
        value = self.sha256.get(arch)
        if value is None:
            raise VersionsError(
                f"no SHA-256 recorded for NVIDIA-Linux-*-{self.version}.run on {arch}: "
                f"`invoke record-driver {self.version}` writes it into versions.toml"
            )
        return value

    def redist_checksums(self, arch: str) -> dict[str, str | None]:
        """``component.arch`` -> SHA-256 of each redist archive recorded for arch (None: TODO).

        A driver without a redist table records none: the image build then refuses each
        archive, naming where to record it.
        """
        return {
            f"{archive.component}.{arch}": archive.sha256[arch]
            for archive in self.redist
            if arch in archive.sha256  # libnvsdm: amd64 only
        }


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
    drivers.sort(key=lambda driver: driver_key(driver.version))
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
    twice = sorted({name for name in value if value.count(name) > 1})
    if twice:  # an index would list that platform twice
        raise VersionsError(f"{what}: {', '.join(twice)} is listed twice: list each once")
    return tuple(value)


def _pinned(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise VersionsError(f'{what} must be a list of Flatcar versions such as "4593.2.0"')
    bad = [version for version in value if not FLATCAR_VERSION_RE.fullmatch(version)]
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
    assert isinstance(entry, Mapping)  # the sha256 check above
    return Driver(version, checksums, _redist(version, entry.get("redist", {}), source))


def _redist(version: str, table: object, source: str) -> tuple[RedistDigests, ...]:
    what = f"{source}: drivers.{version}.redist"
    if not isinstance(table, Mapping):
        raise VersionsError(f"{what} must be a table of component = {{ version, arch = sum }}")
    archives = []
    for component, fields in table.items():
        if not isinstance(fields, Mapping) or not _COMPONENT.fullmatch(component):
            raise VersionsError(f"{what}.{component}: expected {{ version = ..., amd64 = ... }}")
        listed = fields.get("version")
        if not isinstance(listed, str) or not listed:
            raise VersionsError(f"{what}.{component}.version: expected a version or 'TODO'")
        sums: dict[str, str | None] = {}
        for arch, value in fields.items():
            if arch == "version":
                continue
            if arch not in ARCHES:
                raise VersionsError(f"{what}.{component}: unknown arch {arch!r}")
            sums[arch] = _checksum(value, f"{what}.{component}.{arch}")
        version_or_none = None if listed == UNKNOWN_CHECKSUM else listed
        archives.append(RedistDigests(component, version_or_none, sums))
    return tuple(archives)


def _checksum(value: object, what: str) -> str | None:
    if value == UNKNOWN_CHECKSUM:
        return None
    try:
        return valid_sha256(value if isinstance(value, str) else "", what)
    except DriverError:
        raise VersionsError(f"{what}: expected 64 hex digits or {UNKNOWN_CHECKSUM!r}") from None
