"""What to publish: the Flatcar releases to cover, crossed with the drivers and the arches.

The releases covered are the current release of each channel that versions.toml lists
(``lts``: every live LTS stream, from the feed's ``current-<year>`` markers) plus the releases
pinned there. Each (driver, arch) gets a build-image entry, tagged ``<driver>-flatcar`` with one
alias per covered release it can serve, and each (driver, release, arch) a precompiled entry.
Entries of different arches share their tags: they are the platforms of one multi-arch image.

Excluded, with the reason: releases without a kernel in the feed (nothing to name the
precompiled tag after), arches a release is not built for, and driver/kernel pairs known not to
build, i.e. a driver branch that a kernel change broke (:data:`KERNEL_BREAKS`) and for which the
entrypoint ships no compatibility patch (``patches/index.json``, chosen by its own
:func:`~nvidia_driver.patches.select_patches`).

``invoke matrix --json`` prints one line, ready for ``$GITHUB_OUTPUT``::

    {"include": [{"id": "build-610.57.04-amd64", "variant": "build",
                  "driver": "610.57.04", "branch": "610", "arch": "amd64",
                  "flatcar": "", "channel": "", "streams": [], "kernel": "",
                  "aliases": ["4081.3.10", "4593.2.5", "4757.1.0", "4790.0.0"],
                  "repository": "ghcr.io/me/driver",
                  "tags": ["610.57.04-flatcar", "610.57.04-flatcar-flatcar4081.3.10", ...]},
                 {"id": "precompiled-610.57.04-4593.2.5-amd64", "variant": "precompiled",
                  "driver": "610.57.04", "branch": "610", "arch": "amd64",
                  "flatcar": "4593.2.5", "channel": "stable", "streams": ["stable"],
                  "kernel": "6.12.102-flatcar", "aliases": [],
                  "repository": "ghcr.io/me/driver",
                  "tags": ["610.57.04-flatcar4593.2.5", "610-6.12.102-flatcar-flatcar4593.2.5"]}],
     "excluded": [{"variant": "*", "driver": "*", "flatcar": "4790.0.1", "arch": "*",
                   "reason": "..."}],
     "releases": [{"flatcar": "4593.2.5", "channel": "stable", "streams": ["stable"],
                   "kernel": "6.12.102-flatcar"}],
     "drivers": ["580.178.04", "595.91.07", "610.57.04"]}

Every ``include`` entry has the same keys ("" or [] where they do not apply; ``repository`` is
``driver`` without --registry). In a workflow::

    strategy:
      matrix:
        include: ${{ fromJSON(needs.matrix.outputs.json).include }}

or, one job per driver, ``driver: ${{ fromJSON(needs.matrix.outputs.json).drivers }}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gdc import releases
from gdc.table import format_table
from gdc.tags import DEFAULT_IMAGE, ImageTags, Variant, build_image_tags, precompiled_tags
from gdc.tags import repository as join_repository
from gdc.versions import Driver, Versions
from nvidia_driver.errors import DriverError
from nvidia_driver.flatcar import (
    Channel,
    FlatcarVersion,
    Release,
    current_releases,
    parse_releases,
)
from nvidia_driver.patches import parse_kernel_release, select_patches, shipped_patches

ALL = "*"  # an exclusion's variant, driver or arch that stands for every one
PINNED = "pinned"  # the stream name of a release covered because versions.toml pins it
# releases.json keeps a `current-<year>` marker for every LTS stream ever made. A stream whose
# newest release is this much older than the feed's newest is no longer maintained (live ones
# get a release every month or two; 4081's longest gap was 7 months).
LTS_STREAM_MAX_AGE = timedelta(days=240)
_LTS_MARKER = "current-"


@dataclass(frozen=True)
class KernelBreak:
    """A kernel change that old driver branches need a compatibility patch for.

    From which kernel it breaks comes from the entrypoint's patch index (the lowest
    ``min_kernel`` of the patches named ``patch``); which branches it breaks is said here.
    """

    patch: str  # the patch's name in patches/index.json
    tree: str  # the source tree it breaks: kernel-open or kernel
    fixed_in_branch: int  # the first branch whose own sources handle the change


KERNEL_BREAKS = (
    # Linux 6.12.97 gave pci_resize_resource() a 4th argument; NVIDIA's sources handle it from
    # 580 on, Flatcar patches 535, 550 and 570 (flatcar/scripts a08a106, fa087c4).
    KernelBreak("pci-resize-resource-exclude-bars", "kernel-open", 580),
)


@dataclass(frozen=True)
class Covered:
    """A release to publish images for, and why: the streams it is current for, or pinned."""

    release: Release
    streams: tuple[str, ...]

    @property
    def version(self) -> str:
        return str(self.release.version)


@dataclass(frozen=True)
class Exclusion:
    variant: str  # build, precompiled or ALL
    driver: str  # a driver version or ALL
    flatcar: str  # a Flatcar version, or the stream whose current release is unknown
    arch: str  # an arch or ALL
    reason: str


@dataclass(frozen=True)
class Entry:
    """One platform of one image: what ``invoke publish`` builds and tags."""

    variant: Variant
    driver: Driver
    arch: str
    tags: ImageTags
    release: Covered | None = None  # None for the build image
    aliases: tuple[str, ...] = ()  # Flatcar versions of the build image's alias tags

    @property
    def id(self) -> str:
        release = f"-{self.release.version}" if self.release else ""
        return f"{self.variant}-{self.driver.version}{release}-{self.arch}"


@dataclass(frozen=True)
class Matrix:
    releases: tuple[Covered, ...]
    entries: tuple[Entry, ...]
    excluded: tuple[Exclusion, ...]


# --- releases ----------------------------------------------------------------------------------


def _has_kernel(entry: object) -> bool:
    software = entry.get("major_software") if isinstance(entry, Mapping) else None
    kernels = software.get("kernel") if isinstance(software, Mapping) else None
    return isinstance(kernels, list) and bool(kernels) and isinstance(kernels[0], str)


def _is_version(key: str) -> bool:
    try:
        FlatcarVersion.parse(key)
    except DriverError:
        return False
    return True


def _stream_of_marker(key: str, entry: Mapping[str, Any]) -> str:
    """``current`` marks its channel's release (stable's in releases.json); ``current-Y``, LTS Y."""
    if key.startswith(_LTS_MARKER):
        return f"lts-{key.removeprefix(_LTS_MARKER)}"
    return str(entry.get("channel", ""))


def _kernelless_current(feed: Mapping[str, Any], current: Mapping[str, Release]) -> dict[str, str]:
    """Streams whose current release the feed lists without a kernel: stream -> version.

    Such a release (and any marker copying it) is left out of the parse, which then falls back
    to an older release; the stream is reported as excluded instead.
    """
    missing = {
        key: entry
        for key, entry in feed.items()
        if _is_version(key) and isinstance(entry, Mapping) and not _has_kernel(entry)
    }
    found: dict[str, str] = {}
    for key, marker in feed.items():
        if _is_version(key) or not isinstance(marker, Mapping) or _has_kernel(marker):
            continue
        copies = [
            version
            for version, entry in missing.items()
            if (entry.get("channel"), entry.get("release_date"))
            == (marker.get("channel"), marker.get("release_date"))
        ]
        found[_stream_of_marker(key, marker)] = max(copies, key=FlatcarVersion.parse, default=key)
    marked_channels = {str(m.get("channel")) for k, m in feed.items()
                       if k == "current" and isinstance(m, Mapping)}  # fmt: skip
    for version, entry in missing.items():
        channel = str(entry.get("channel", ""))
        if channel not in {Channel.ALPHA, Channel.BETA, Channel.STABLE}:
            continue  # LTS streams are only known from their markers
        if channel in marked_channels or channel in found:
            continue
        newest = current.get(channel)
        if newest is None or FlatcarVersion.parse(version) > newest.version:
            found[channel] = version
    return found


def _parse(feed_text: str) -> Mapping[str, Any]:
    try:
        feed = json.loads(feed_text)
    except json.JSONDecodeError as exc:
        raise releases.ReleaseError(
            f"the Flatcar releases feed is not JSON ({exc}); check --releases-url points at "
            "a releases.json"
        ) from None
    if not isinstance(feed, Mapping):
        raise releases.ReleaseError(
            "the Flatcar releases feed is not an object keyed by version; check --releases-url "
            "points at a releases.json"
        )
    return feed


def _wanted(stream: str, channels: Iterable[str]) -> bool:
    wanted = set(channels)
    return stream in wanted or (Channel.LTS in wanted and stream.startswith(Channel.LTS))


def _no_kernel(version: str, stream: str) -> Exclusion:
    return Exclusion(ALL, ALL, version, ALL,
                     f"Flatcar {version} ({stream}) has no kernel in the releases feed "
                     "(major_software.kernel): nothing is built or tagged for it until the feed "
                     "lists one; re-run later")  # fmt: skip


def _unmaintained(stream: str, release: Release, newest: Release) -> Exclusion | None:
    age = newest.release_date - release.release_date
    if not stream.startswith(f"{Channel.LTS}-") or age <= LTS_STREAM_MAX_AGE:
        return None
    return Exclusion(ALL, ALL, str(release.version), ALL,
                     f"{stream}'s newest release is from {release.release_date:%Y-%m-%d}, "
                     f"{age.days} days before the feed's newest: the stream is no longer "
                     "maintained; pin the release in versions.toml to cover it anyway")  # fmt: skip


def covered_releases(
    feed_text: str, versions: Versions
) -> tuple[tuple[Covered, ...], tuple[Exclusion, ...]]:
    """The releases to cover (oldest first), and those left out with the reason."""
    feed = _parse(feed_text)
    complete = {key: entry for key, entry in feed.items() if _has_kernel(entry)}
    try:
        current = current_releases(complete)
        known = parse_releases(complete)
    except DriverError as exc:
        raise releases.ReleaseError(str(exc)) from None
    kernelless = _kernelless_current(feed, current)
    if any(stream.startswith(f"{Channel.LTS}-") for stream in kernelless):
        current.pop(Channel.LTS, None)  # a fallback to an older LTS release, not a stream
    excluded = [_no_kernel(version, stream) for stream, version in sorted(kernelless.items())
                if _wanted(stream, versions.channels)]  # fmt: skip
    streams: dict[Release, list[str]] = {}
    newest = max(known, key=lambda release: release.release_date, default=None)
    for stream, release in current.items():
        if not _wanted(stream, versions.channels) or stream in kernelless or newest is None:
            continue
        unmaintained = _unmaintained(stream, release, newest)
        if unmaintained:
            excluded.append(unmaintained)
        else:
            streams.setdefault(release, []).append(stream)
    by_version = {str(release.version): release for release in known}
    for version in versions.pinned:
        if version in by_version:
            streams.setdefault(by_version[version], []).append(PINNED)
        elif version in feed:
            excluded.append(_no_kernel(version, PINNED))
        else:
            excluded.append(Exclusion(ALL, ALL, version, ALL,
                                      f"Flatcar {version} is pinned in versions.toml but not in "
                                      "the releases feed: check the version"))  # fmt: skip
    covered = tuple(
        Covered(release, tuple(names))
        for release, names in sorted(streams.items(), key=lambda item: item[0].version)
    )
    return covered, tuple(excluded)


# --- drivers -----------------------------------------------------------------------------------


def _break_since(kernel_break: KernelBreak) -> str:
    kernels = [patch.min_kernel for patch in shipped_patches() if patch.name == kernel_break.patch]
    if not kernels:
        raise releases.ReleaseError(
            f"gdc.matrix.KERNEL_BREAKS names patch {kernel_break.patch!r}, which "
            "patches/index.json does not list: fix the name"
        )
    return str(min(kernels))


def build_problem(driver: Driver, kernel_release: str) -> str:
    """Why driver's modules do not build for the kernel, or "" when they should."""
    branch = int(driver.branch)
    kernel = parse_kernel_release(kernel_release)
    for kernel_break in KERNEL_BREAKS:
        since = _break_since(kernel_break)
        if branch >= kernel_break.fixed_in_branch or kernel < parse_kernel_release(since):
            continue
        selected = select_patches(branch, kernel_release, kernel_break.tree)
        if any(patch.name == kernel_break.patch for patch in selected):
            continue
        return (
            f"driver {driver.version} {kernel_break.tree} does not build on kernel "
            f"{kernel_release}: it needs patch {kernel_break.patch} (kernels from {since}; "
            f"fixed by NVIDIA from branch {kernel_break.fixed_in_branch}) and "
            f"entrypoint/src/nvidia_driver/patches/index.json has none for branch {branch}; "
            "add one or drop the driver"
        )
    return ""


# --- the matrix --------------------------------------------------------------------------------


def build_matrix(
    feed_text: str,
    versions: Versions,
    *,
    registry: str = "",
    image: str = DEFAULT_IMAGE,
    prefix: str = "",
) -> Matrix:
    covered, excluded_releases = covered_releases(feed_text, versions)
    repository = join_repository(registry, image)
    entries: list[Entry] = []
    excluded = list(excluded_releases)
    for driver in versions.drivers if covered else ():  # no release: nothing to alias or build
        servable: list[Covered] = []
        for release in covered:
            problem = build_problem(driver, release.release.kernel_release)
            if problem:
                excluded.append(Exclusion(ALL, driver.version, release.version, ALL, problem))
            else:
                servable.append(release)
        aliases = tuple(release.version for release in servable)
        build = ImageTags(repository, build_image_tags(driver.version, aliases, prefix))
        entries += [Entry(Variant.BUILD, driver, arch, build, aliases=aliases)
                    for arch in versions.arches]  # fmt: skip
        for release in servable:
            kernel = release.release.kernel_release
            tags = ImageTags(
                repository, precompiled_tags(driver.version, release.version, kernel, prefix)
            )
            for arch in versions.arches:
                if arch in release.release.arches:
                    entries.append(Entry(Variant.PRECOMPILED, driver, arch, tags, release))
                else:
                    excluded.append(Exclusion(
                        Variant.PRECOMPILED.value, driver.version, release.version, arch,
                        f"Flatcar {release.version} is not released for {arch}"))  # fmt: skip
    return Matrix(covered, tuple(entries), tuple(excluded))


def aliases_for(feed_text: str, versions: Versions, driver: Driver) -> tuple[str, ...]:
    """The Flatcar versions the build image of driver gets an alias tag for."""
    covered, _ = covered_releases(feed_text, versions)
    return tuple(c.version for c in covered if not build_problem(driver, c.release.kernel_release))


# --- output ------------------------------------------------------------------------------------


def _entry_json(entry: Entry) -> dict[str, Any]:
    release = entry.release
    return {
        "id": entry.id,
        "variant": entry.variant.value,
        "driver": entry.driver.version,
        "branch": entry.driver.branch,
        "arch": entry.arch,
        "flatcar": release.version if release else "",
        "channel": release.release.channel if release else "",
        "streams": list(release.streams) if release else [],
        "kernel": release.release.kernel_release if release else "",
        "aliases": list(entry.aliases),
        "repository": entry.tags.repository,
        "tags": list(entry.tags.tags),
    }


def to_json(matrix: Matrix) -> str:
    """One line of JSON (see the module docstring for its shape)."""
    document = {
        "include": [_entry_json(entry) for entry in matrix.entries],
        # The drivers with a build image, oldest first: a job per driver fans out over these.
        "drivers": list(dict.fromkeys(
            e.driver.version for e in matrix.entries if e.variant is Variant.BUILD
        )),
        "excluded": [vars(exclusion) for exclusion in matrix.excluded],
        "releases": [
            {"flatcar": c.version, "channel": c.release.channel, "streams": list(c.streams),
             "kernel": c.release.kernel_release}
            for c in matrix.releases
        ],
    }  # fmt: skip
    return json.dumps(document, separators=(",", ":"))


def _tags_cell(entry: Entry) -> str:
    if entry.variant is Variant.BUILD:
        aliases = len(entry.tags.tags) - 1
        return f"{entry.tags.tags[0]} (+{aliases} alias{'es' if aliases != 1 else ''})"
    return ", ".join(entry.tags.tags)


def to_table(matrix: Matrix) -> str:
    lines = [f"Flatcar releases ({len(matrix.releases)}):\n"]
    lines.append(format_table(
        ("FLATCAR", "STREAMS", "KERNEL", "ARCHES"),
        [(c.version, ",".join(c.streams), c.release.kernel_release, ",".join(c.release.arches))
         for c in matrix.releases],
    ))  # fmt: skip
    lines.append(f"\nImages ({len(matrix.entries)} entries):\n")
    lines.append(format_table(
        ("VARIANT", "DRIVER", "FLATCAR", "KERNEL", "ARCH", "TAGS"),
        [(e.variant.value, e.driver.version, e.release.version if e.release else "-",
          e.release.release.kernel_release if e.release else "-", e.arch, _tags_cell(e))
         for e in matrix.entries],
    ))  # fmt: skip
    if matrix.excluded:
        lines.append(f"\nExcluded ({len(matrix.excluded)}):\n")
        lines.append(format_table(
            ("VARIANT", "DRIVER", "FLATCAR", "ARCH", "REASON"),
            [(x.variant, x.driver, x.flatcar, x.arch, x.reason) for x in matrix.excluded],
        ))  # fmt: skip
    return "".join(lines)
