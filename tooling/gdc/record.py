"""``invoke record-driver VERSION``: versions.toml's entry for a driver, from NVIDIA's own files.

* The ``.run``'s SHA-256 per arch is what NVIDIA's ``<file>.run.sha256sum`` says; with
  ``--verify`` the ``.run`` the image build downloads (the datacenter copy) is hashed as well
  and must agree.
* Each redist archive the image installs (sources/redist.py: fabric manager, NSCQ, NVLSM, IMEX,
  NVSDM) gets the version and the per-arch SHA-256 that ``redistrib_<version>.json`` lists;
  what it does not list stays ``"TODO"``, as the image build expects.
* Every value gets a comment saying where it came from.

Refused with one line, and nothing written:

* a manifest whose versions disagree: its ``release_label`` is not the driver it was fetched
  for; a driver-versioned component (fabric manager, NSCQ, IMEX, NVSDM: those redist.py marks
  ``driver_version``) lists another version than the driver; or an archive's
  ``relative_path`` is not ``<component>/linux-<platform>/<component>-linux-<platform>-
  <version>-archive.tar.xz`` for the version its component lists (the file would be another
  version than the one recorded);
* a ``.sha256sum`` that names another file than the ``.run`` it sits beside;
* a URL, or a redirect, to a host that is not NVIDIA's (gdc.nvidia);
* a value that differs from one versions.toml already records for the same driver (those came
  from packagers, whose sources it cites): the record cross-checks them, it never overwrites;
* replacing a branch's driver with an older release.

versions.toml is edited as text (gdc.versions_text), checked to parse to exactly the old
content with this one entry changed, and replaced atomically.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gdc import versions_text
from gdc.nvidia import (
    MAX_CHECKSUM_BYTES,
    MAX_MANIFEST_BYTES,
    Nvidia,
    NvidiaUpstream,
    RecordError,
    check_release,
    parse_checksum_file,
)
from gdc.versions import UNKNOWN_CHECKSUM, Driver, VersionsError, parse_versions
from nvidia_driver.atomic import write_atomically
from nvidia_driver.digests import valid_sha256
from nvidia_driver.errors import DriverError
from nvidia_driver.naming import ARCHES, driver_key, redist_platform, run_name
from nvidia_driver.sources import redist

_VERSION_TEXT = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ._-+")


@dataclass(frozen=True)
class Checksum:
    arch: str
    sha256: str
    source: str  # the .sha256sum's URL
    verified: str = ""  # the .run --verify hashed; "" without --verify


@dataclass(frozen=True)
class Archive:
    """One component of redistrib_<version>.json as recorded."""

    component: str
    version: str | None  # None: not listed (NVLSM has its own versions)
    sha256: Mapping[str, str | None]  # arch -> SHA-256; None: not listed
    platforms: tuple[str, ...]  # the platforms the manifest lists it for


@dataclass(frozen=True)
class Record:
    version: str
    checksums: tuple[Checksum, ...]
    manifest: str  # redistrib_<version>.json's URL
    archives: tuple[Archive, ...]
    date: str  # the day it was recorded, for the comment

    def entry(self) -> str:
        """The versions.toml text of this driver's tables."""
        version, todo = self.version, UNKNOWN_CHECKSUM
        lines = [
            f'[drivers."{version}"]',
            f"# Recorded by `invoke record-driver {version}` on {self.date} from NVIDIA's files.",
        ]
        for checksum in self.checksums:
            verified = f"; --verify: {checksum.verified} matches" if checksum.verified else ""
            lines.append(
                f'sha256.{checksum.arch} = "{checksum.sha256}"  # {checksum.source}{verified}'
            )
        lines += ["", f'[drivers."{version}".redist]', f"# {self.manifest}"]
        for archive in self.archives:
            fields = [f'version = "{archive.version or todo}"'] + [
                f'{arch} = "{digest or todo}"' for arch, digest in archive.sha256.items()
            ]
            lines.append(
                f"{archive.component} = {{ {', '.join(fields)} }}  # {self._note(archive)}"
            )
        return "\n".join(lines) + "\n"

    def _note(self, archive: Archive) -> str:
        name = f"redistrib_{self.version}.json"
        if not archive.platforms:
            return (
                f"not in {name}: `invoke record-driver {self.version}` fills it once NVIDIA "
                "lists it"
            )
        missing = [
            redist_platform(arch) for arch, digest in archive.sha256.items() if digest is None
        ]
        listed = f"{name}: {archive.component} {', '.join(archive.platforms)}"
        return f"{listed}; none for {', '.join(missing)}" if missing else listed

    def missing_required(self) -> list[str]:
        """``<component> for <platform>`` of each archive every image needs (redist.py marks it
        required) that the manifest does not list: invoke build refuses the driver without it."""
        return [f"{archive.component} for {redist_platform(arch)}" for archive in self.archives
                if archive.component in redist.REQUIRED_KEYS
                for arch, digest in archive.sha256.items() if digest is None]  # fmt: skip

    def summary(self) -> str:
        listed = [a.component for a in self.archives if a.platforms]
        todo = [a.component for a in self.archives if None in a.sha256.values()]
        verified = " (verified against the .run)" if all(c.verified for c in self.checksums) else ""
        return (
            f".run {', '.join(c.arch for c in self.checksums)}{verified}; redist "
            f"{', '.join(listed) or 'none'}; TODO: {', '.join(todo) or 'none'}"
        )


def parse_manifest(manifest: object, version: str, url: str) -> tuple[Archive, ...]:
    """The archives redist.py installs, as redistrib_<version>.json lists them."""
    name = f"redistrib_{version}.json"
    if not isinstance(manifest, Mapping):
        raise RecordError(f"{url} is not a redistrib manifest (not a JSON object)")
    label = manifest.get("release_label")
    if label != version:
        raise RecordError(
            f"{name} has release_label {label!r}, not {version}: the manifest's "
            "versions disagree; nothing was written"
        )
    return tuple(
        _archive(component, manifest.get(component.key), version, name)
        for component in redist.COMPONENTS
    )


def _archive(component: redist.Component, entry: object, driver: str, name: str) -> Archive:
    key = component.key
    if entry is None:
        return Archive(
            key, driver if component.driver_version else None, dict.fromkeys(component.arches), ()
        )
    listed = entry.get("version") if isinstance(entry, Mapping) else None
    if not isinstance(listed, str) or not listed or not set(listed) <= _VERSION_TEXT:
        raise RecordError(f"{name}: {key} has no version (got {listed!r}); nothing was written")
    assert isinstance(entry, Mapping)  # the version check above
    if component.driver_version and listed != driver:
        raise RecordError(
            f"{name} lists {key} {listed} for driver {driver}: the {component.title} must "
            "carry the driver's version; the manifest's versions disagree, nothing was written"
        )
    sums: dict[str, str | None] = {}
    platforms = []
    for arch in component.arches:
        platform = redist_platform(arch)
        files = entry.get(platform)
        sums[arch] = None if files is None else _digest(files, key, platform, listed, name)
        if files is not None:
            platforms.append(platform)
    return Archive(key, listed, sums, tuple(platforms))


def _digest(files: object, key: str, platform: str, version: str, name: str) -> str:
    expected = f"{key}/{platform}/{key}-{platform}-{version}-archive.tar.xz"
    path = files.get("relative_path") if isinstance(files, Mapping) else None
    if path != expected:
        raise RecordError(
            f"{name} lists {key} {version} but its {platform} archive as {path!r}, not "
            f"{expected}: the manifest's versions disagree; nothing was written"
        )
    assert isinstance(files, Mapping)  # relative_path matched
    try:
        return valid_sha256(str(files.get("sha256", "")), f"{name}: {key} {platform} sha256")
    except DriverError as exc:
        raise RecordError(str(exc)) from None


def fetch(
    version: str, nvidia: Nvidia, upstream: NvidiaUpstream, *, verify: bool, date: str
) -> Record:
    """Read NVIDIA's files for version (and hash each .run with verify)."""
    checksums = []
    for arch in ARCHES:
        url = upstream.checksum_url(version, arch)
        text = nvidia.text(url, MAX_CHECKSUM_BYTES, "a .sha256sum file")
        sha256 = parse_checksum_file(text, run_name(version, arch), url)
        verified = ""
        if verify:
            run_url = upstream.run_url(version, arch)
            actual = nvidia.sha256(run_url)
            if actual != sha256:
                raise RecordError(
                    f"{run_url} has SHA-256 {actual}, but {url} says {sha256}: the download or "
                    "NVIDIA's file is wrong; nothing was written"
                )
            verified = run_url
        checksums.append(Checksum(arch, sha256, url, verified))
    manifest_url = upstream.manifest_url(version)
    manifest = nvidia.json(manifest_url, MAX_MANIFEST_BYTES, "a redistrib manifest")
    return Record(
        version,
        tuple(checksums),
        manifest_url,
        parse_manifest(manifest, version, manifest_url),
        date,
    )


def cross_check(record: Record, recorded: Driver) -> None:
    """Refuse a value of record that differs from what versions.toml records for its driver."""
    where = f'versions.toml [drivers."{record.version}"]'
    for checksum in record.checksums:
        old = recorded.sha256.get(checksum.arch)
        if old is not None and old != checksum.sha256:
            raise RecordError(
                f"{where} records {old} for {run_name(record.version, checksum.arch)}, but "
                f"{checksum.source} says {checksum.sha256}: check both sources; nothing was "
                "written"
            )
    before = {archive.component: archive for archive in recorded.redist}
    for archive in record.archives:
        old_archive = before.get(archive.component)
        if old_archive is None:
            continue
        pairs = [("version", old_archive.version, archive.version)] + [
            (arch, old_archive.sha256.get(arch), archive.sha256.get(arch)) for arch in ARCHES
        ]
        for field, old_value, new_value in pairs:
            if old_value is not None and old_value != new_value:
                raise RecordError(
                    f"{where} records {archive.component} {field} = {old_value}, but "
                    f"redistrib_{record.version}.json lists {new_value or 'none'}: check both "
                    "sources; nothing was written"
                )


@dataclass(frozen=True)
class _Current:
    """The versions file as it is, and the driver of the branch being recorded."""

    path: Path
    text: str
    data: dict[str, Any]
    tracked: Driver | None


def _current(path: Path, version: str) -> _Current:
    """Read the versions file; refuse replacing a branch's driver with an older release."""
    if not path.is_file():
        raise RecordError(f"{path} is not a file: give the versions file with --versions-file")
    try:
        text = path.read_text()
        data = tomllib.loads(text)
        versions = parse_versions(data, source=str(path))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, VersionsError) as exc:
        raise RecordError(f"cannot read {path}: {exc}") from None
    branch = version.split(".", 1)[0]
    tracked = next((driver for driver in versions.drivers if driver.branch == branch), None)
    if tracked is not None and driver_key(tracked.version) > driver_key(version):
        raise RecordError(
            f"{path} lists {tracked.version}, newer than {version}: a branch's entry is only "
            "replaced by a newer release (versions.toml keeps each branch's newest)"
        )
    return _Current(path, text, data, tracked)


def write(record: Record, current: _Current) -> str | None:
    """Put record's entry into the versions file; the driver version it replaced."""
    replaced = current.tracked.version if current.tracked is not None else None
    if current.tracked is not None and replaced == record.version:
        cross_check(record, current.tracked)
    after_text = versions_text.put_entry(current.text, record.entry(), record.version, replaced)
    _check_edit(current.data, after_text, record, replaced, current.path)
    write_atomically(current.path, after_text, current.path.stat().st_mode & 0o777)
    return replaced


def _check_edit(
    before: dict[str, Any], after_text: str, record: Record, replaced: str | None, path: Path
) -> None:
    """The edited text parses to the old content with only this driver's entry changed."""
    try:
        after = tomllib.loads(after_text)
        parse_versions(after, source=str(path))
    except (tomllib.TOMLDecodeError, VersionsError) as exc:
        raise RecordError(
            f"the edit of {path} would not parse ({exc}); nothing was written"
        ) from None
    expected = {**before, "drivers": dict(before.get("drivers", {}))}
    expected["drivers"].pop(replaced, None)
    expected["drivers"][record.version] = tomllib.loads(record.entry())["drivers"][record.version]
    if after != expected:
        raise RecordError(
            f"the edit of {path} would change more than the entry of "
            f"{record.version}; nothing was written"
        )


def record_driver(
    version: str,
    path: Path,
    upstream: NvidiaUpstream,
    *,
    verify: bool,
    date: str,
    env: Mapping[str, str] | None = None,
) -> tuple[Record, str | None]:
    """Fetch, check and write one driver's entry: (the record, the version it replaced)."""
    check_release(version)
    current = _current(path, version)
    nvidia = Nvidia(os.environ if env is None else env)
    for url in (
        upstream.checksum_url(version, "amd64"),
        upstream.run_url(version, "amd64"),
        upstream.manifest_url(version),
    ):
        nvidia.check(url)  # every host, before the first request
    record = fetch(version, nvidia, upstream, verify=verify, date=date)
    return record, write(record, current)


def summary_line(record: Record, replaced: str | None, path: Path | str) -> str:
    what = (
        f"replaces {replaced}"
        if replaced not in {None, record.version}
        else ("re-recorded" if replaced else "added")
    )
    return f'wrote {path} [drivers."{record.version}"] ({what}): {record.summary()}'
