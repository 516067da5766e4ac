"""Which Flatcar releases are live: each stream's current release, read leniently from the feed.

The feed is Flatcar's ``releases.json`` (flatcar-website ``static/releases-json/``, written by
``tools/release-scripts/releases_as_json.py``): versioned entries plus markers that copy one of
them, ``current`` (stable's current release) and ``current-<year>`` (one per LTS stream ever
made, dead ones included). Only those two kinds of keys are markers; any other key is reported
and ignored.

Which LTS streams are alive comes from Flatcar's ``lts-info`` (lines ``major:year:supported``
or ``major:year:unsupported``; read by flatcar-website ``update-flatcar-versions.sh`` and
flatcar/scripts ``.github/workflows/figure-out-branch.sh``). Without it, the streams come from
the ``current-<year>`` markers and a stream is taken for dead when its newest release is more
than :data:`LTS_STREAM_MAX_AGE` older than the feed's newest; the matrix says so in a note.

An entry is parsed on its own: a bad entry that could not be current anyway (an older release
of its channel) is reported in a note; one that would be current excludes its stream with the
reason, and the stream is not silently served by an older release. Each channel that
versions.toml lists gets a current release or an exclusion; a feed that covers nothing at all
(``{}``, the wrong file) is an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gdc.versions import Versions
from nvidia_driver.sources.flatcar import Channel, FlatcarVersion, Release, kernel_release_from_feed

ALL = "*"  # an exclusion's variant, driver or arch that stands for every one
PINNED = "pinned"  # the stream name of a release covered because versions.toml pins it
CURRENT = "current"
LTS_INFO_URL = "https://lts.release.flatcar-linux.net/lts-info"
LTS_INFO_URL_ENV = "FLATCAR_LTS_INFO_URL"
# Without lts-info: live LTS streams get a release every month or two; 4081's longest gap
# between two releases was 223 days.
LTS_STREAM_MAX_AGE = timedelta(days=240)
_VERSION_KEY = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")  # ASCII digits only
_LTS_MARKER = re.compile(r"current-([0-9]{4})")
_LTS_INFO_LINE = re.compile(r"([0-9]+):([0-9]{4}):(supported|unsupported)")
_DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"  # what releases_as_json.py writes with strftime
_CHANNELS = (Channel.ALPHA, Channel.BETA, Channel.STABLE)


class ReleaseError(LookupError):
    """The feed cannot say what was asked."""


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
class LtsStream:
    major: int
    year: str
    supported: bool

    @property
    def name(self) -> str:
        return f"{Channel.LTS}-{self.year}"


def parse_lts_info(text: str) -> tuple[LtsStream, ...]:
    """lts-info's ``major:year:supported|unsupported`` lines (blank lines are skipped)."""
    streams = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        match = _LTS_INFO_LINE.fullmatch(line)
        if match is None:
            raise ReleaseError(f"lts-info line {number} is {line[:60]!r}, not "
                               "'major:year:supported' or 'major:year:unsupported'")  # fmt: skip
        major, year, status = match.groups()
        streams.append(LtsStream(int(major), year, status == "supported"))
    if not streams:
        raise ReleaseError("lts-info is empty")
    return tuple(streams)


@dataclass(frozen=True)
class LtsInfo:
    """lts-info as read, or why it could not be (then the streams are judged by age)."""

    streams: tuple[LtsStream, ...] = ()
    unavailable: str = ""


@dataclass(frozen=True)
class _Unusable:
    version: FlatcarVersion
    channel: str
    reason: str


@dataclass
class Feed:
    """The feed, entry by entry: usable releases, unusable entries with the reason, markers."""

    releases: dict[FlatcarVersion, Release] = field(default_factory=dict)
    unusable: dict[FlatcarVersion, _Unusable] = field(default_factory=dict)
    entries: dict[FlatcarVersion, Any] = field(default_factory=dict)  # as the feed has them
    markers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def channel_of(self, version: FlatcarVersion) -> str:
        if version in self.releases:
            return self.releases[version].channel
        return self.unusable[version].channel

    def versions(self, channel: str, major: int | None = None) -> list[FlatcarVersion]:
        """Every version (usable or not) of channel, oldest first."""
        return sorted(v for v in (*self.releases, *self.unusable)
                      if self.channel_of(v) == channel and major in (None, v.major))  # fmt: skip

    def copied_by(self, marker: str) -> FlatcarVersion | None:
        """The newest versioned entry that marker is a copy of."""
        copies = [v for v, entry in self.entries.items() if entry == self.markers[marker]]
        return max(copies, default=None)

    @property
    def newest_date(self) -> datetime | None:
        return max((r.release_date for r in self.releases.values()), default=None)


def _entry_problem(entry: object) -> str:
    if not isinstance(entry, Mapping):
        return "the entry is not an object"
    software = entry.get("major_software")
    kernels = software.get("kernel") if isinstance(software, Mapping) else None
    if not isinstance(kernels, list) or not kernels or not isinstance(kernels[0], str):
        return "has no kernel in the releases feed (major_software.kernel)"
    if not isinstance(entry.get("channel"), str) or not entry["channel"]:
        return "has no channel"
    arches = entry.get("architectures")
    if not isinstance(arches, list) or not all(isinstance(arch, str) for arch in arches):
        return "its architectures is not a list of names"
    try:
        datetime.strptime(str(entry.get("release_date")), _DATE_FORMAT)  # noqa: DTZ007 - %z
    except ValueError:
        date = str(entry.get("release_date"))[:40]
        return f"its release_date {date!r} is not 'YYYY-MM-DD HH:MM:SS +ZZZZ'"
    return ""


def _release(version: FlatcarVersion, entry: Mapping[str, Any]) -> Release:
    return Release(
        version,
        entry["channel"],
        kernel_release_from_feed(entry["major_software"]["kernel"][0]),
        tuple(entry["architectures"]),
        datetime.strptime(entry["release_date"], _DATE_FORMAT),  # noqa: DTZ007 - it has %z
    )


def _guess_channel(version: FlatcarVersion, entry: object) -> str:
    channel = entry.get("channel") if isinstance(entry, Mapping) else None
    if isinstance(channel, str) and channel:
        return channel
    return str(version.channel) if version.minor < len(_CHANNELS) + 1 else ""


def read_feed(text: str) -> Feed:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReleaseError(f"the Flatcar releases feed is not JSON ({exc}); check "
                           "--releases-url points at a releases.json") from None  # fmt: skip
    if not isinstance(document, Mapping):
        raise ReleaseError("the Flatcar releases feed is not an object keyed by version; check "
                           "--releases-url points at a releases.json")  # fmt: skip
    feed = Feed()
    unknown = []
    for key, entry in document.items():
        if key == CURRENT or _LTS_MARKER.fullmatch(key):
            feed.markers[key] = entry
        elif _VERSION_KEY.fullmatch(key):
            version = FlatcarVersion.parse(key)
            feed.entries[version] = entry
            problem = _entry_problem(entry)
            if problem:
                feed.unusable[version] = _Unusable(version, _guess_channel(version, entry), problem)
            else:
                feed.releases[version] = _release(version, entry)
        else:
            unknown.append(key)
    if unknown:
        shown = ", ".join(repr(key[:40]) for key in unknown[:5])
        feed.notes.append(f"the releases feed has {len(unknown)} key(s) that are neither a "
                          f"version nor a current marker, ignored: {shown}")  # fmt: skip
    return feed


# --- streams -----------------------------------------------------------------------------------

Current = Release | _Unusable


def _channel_current(feed: Feed, channel: str) -> Current | None:
    marked = feed.markers.get(CURRENT)
    if isinstance(marked, Mapping) and marked.get("channel") == channel:
        version = feed.copied_by(CURRENT)
        if version is not None:
            return feed.releases.get(version) or feed.unusable[version]
        feed.notes.append(f"the feed's {CURRENT!r} marker copies no versioned {channel} entry: "
                          f"the newest {channel} release is taken instead")  # fmt: skip
    versions = feed.versions(channel)
    if not versions:
        return None
    return feed.releases.get(versions[-1]) or feed.unusable[versions[-1]]


def _lts_from_info(feed: Feed, info: LtsInfo) -> tuple[dict[str, Current], list[Exclusion]]:
    streams: dict[str, Current] = {}
    excluded = []
    for stream in info.streams:
        versions = feed.versions(Channel.LTS, stream.major)
        if not stream.supported:
            if versions or f"current-{stream.year}" in feed.markers:
                excluded.append(Exclusion(ALL, ALL, stream.name, ALL,
                                          f"{stream.name} (Flatcar {stream.major}) is no longer "
                                          "supported (lts-info)"))  # fmt: skip
            continue
        if not versions:
            excluded.append(Exclusion(ALL, ALL, stream.name, ALL,
                                      f"lts-info lists {stream.name} (Flatcar {stream.major}) as "
                                      f"supported, but the releases feed has no {stream.major}.3.x "
                                      "release: check --releases-url"))  # fmt: skip
            continue
        streams[stream.name] = feed.releases.get(versions[-1]) or feed.unusable[versions[-1]]
    return streams, excluded


def _lts_by_age(feed: Feed, info: LtsInfo) -> tuple[dict[str, Current], list[Exclusion]]:
    streams: dict[str, Current] = {}
    excluded = []
    newest = feed.newest_date
    for key in sorted(k for k in feed.markers if k != CURRENT):
        name = f"{Channel.LTS}-{key.removeprefix('current-')}"
        version = feed.copied_by(key)
        if version is None:
            feed.notes.append(f"the feed's {key!r} marker copies no versioned entry: ignored")
            continue
        current = feed.releases.get(version) or feed.unusable[version]
        if isinstance(current, Release) and newest is not None:
            age = newest - current.release_date
            if age > LTS_STREAM_MAX_AGE:
                excluded.append(Exclusion(ALL, ALL, str(version), ALL,
                                          f"{name}'s newest release is from "
                                          f"{current.release_date:%Y-%m-%d}, {age.days} days "
                                          "before the feed's newest: taken for unmaintained "
                                          f"(lts-info unavailable); pin the release in "
                                          "versions.toml to cover it anyway"))  # fmt: skip
                continue
        streams[name] = current
    if not feed.markers.keys() - {CURRENT}:
        versions = feed.versions(Channel.LTS)  # releases-lts.json style: no stream markers
        if versions:
            streams[Channel.LTS.value] = feed.releases.get(versions[-1]) or \
                feed.unusable[versions[-1]]  # fmt: skip
    feed.notes.append(
        f"lts-info could not be read ({info.unavailable}): LTS streams are taken "
        "from the feed's current-<year> markers, and a stream whose newest release "
        f"is over {LTS_STREAM_MAX_AGE.days} days old is taken for unmaintained"
    )
    return streams, excluded


def current_streams(feed: Feed, info: LtsInfo | None, channels: Iterable[str]) -> (
    tuple[dict[str, Current], list[Exclusion]]
):  # fmt: skip
    """The current entry of each wanted stream; the streams left out, with the reason."""
    wanted = set(channels)
    streams: dict[str, Current] = {}
    excluded: list[Exclusion] = []
    for channel in _CHANNELS:
        if channel not in wanted:
            continue
        current = _channel_current(feed, channel)
        if current is None:
            excluded.append(Exclusion(ALL, ALL, channel.value, ALL,
                                      f"the releases feed names no {channel} release (a "
                                      "per-channel feed? --releases-url should be the combined "
                                      "releases.json)"))  # fmt: skip
        else:
            streams[channel.value] = current
    if Channel.LTS in wanted:
        info = info or LtsInfo(unavailable="not read")
        lts, lts_excluded = _lts_from_info(feed, info) if info.streams else _lts_by_age(feed, info)
        excluded += lts_excluded
        if not lts and not lts_excluded:
            excluded.append(Exclusion(ALL, ALL, Channel.LTS.value, ALL,
                                      "the releases feed names no LTS release"))  # fmt: skip
        streams.update(lts)
    return streams, excluded


def _unusable(version: str, stream: str, reason: str) -> Exclusion:
    return Exclusion(ALL, ALL, version, ALL,
                     f"Flatcar {version} ({stream}) {reason}: nothing is built or tagged for it "
                     "until the feed is fixed; re-run later")  # fmt: skip


def covered_releases(
    feed_text: str, versions: Versions, lts_info: LtsInfo | None = None
) -> tuple[tuple[Covered, ...], tuple[Exclusion, ...], tuple[str, ...]]:
    """The releases to cover (oldest first), those left out with the reason, and notes."""
    feed = read_feed(feed_text)
    current, excluded = current_streams(feed, lts_info, versions.channels)
    named: dict[Release, list[str]] = {}
    for stream, entry in current.items():
        if isinstance(entry, Release):
            named.setdefault(entry, []).append(stream)
        else:
            excluded.append(_unusable(str(entry.version), stream, entry.reason))
    for version in versions.pinned:
        parsed = FlatcarVersion.parse(version)
        if parsed in feed.releases:
            named.setdefault(feed.releases[parsed], []).append(PINNED)
        elif parsed in feed.unusable:
            excluded.append(_unusable(version, PINNED, feed.unusable[parsed].reason))
        else:
            excluded.append(Exclusion(ALL, ALL, version, ALL,
                                      f"Flatcar {version} is pinned in versions.toml but not in "
                                      "the releases feed: check the version"))  # fmt: skip
    live = {entry.version for entry in current.values()} | {FlatcarVersion.parse(v)
                                                            for v in versions.pinned}  # fmt: skip
    stale = sorted(v for v in feed.unusable if v not in live)
    if stale:
        shown = "; ".join(f"{v} {feed.unusable[v].reason}" for v in stale[:3])
        more = f" (and {len(stale) - 3} more)" if len(stale) > 3 else ""  # noqa: PLR2004
        feed.notes.append(f"{len(stale)} older feed entr{'y' if len(stale) == 1 else 'ies'} "
                          f"cannot be read, ignored: {shown}{more}")  # fmt: skip
    if not named:
        wanted = ", ".join(versions.channels)
        raise ReleaseError(f"the releases feed covers none of the channels versions.toml lists "
                           f"({wanted}) nor a pinned release; check --releases-url points at "
                           "Flatcar's combined releases.json")  # fmt: skip
    ordered = sorted(named.items(), key=lambda item: item[0].version)
    covered = tuple(Covered(release, tuple(names)) for release, names in ordered)
    return covered, tuple(excluded), tuple(feed.notes)
