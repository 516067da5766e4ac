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

Whatever the feed leaves ambiguous is named, never resolved silently:

* a key given twice (``json.loads`` would keep the last): identical copies get a note; copies
  that differ make their entry unusable (a marker: ignored), as nobody can say which is meant;
* a version key with a leading zero (``4593.02.5``) is read as the version it spells, with a
  note, or ignored when the feed has that version's own key too;
* a version far above the feed's releases (:data:`MAX_MAJOR_JUMP`) is skipped with a note, so
  that a typo such as ``45930.2.5`` cannot become the current release;
* a channel that differs from a known one only in case or spaces (``Stable``) counts as no
  channel, with a note;
* a release that lists two different kernels is unusable (which one do its nodes boot?), and a
  kernel that is not a kernel release (``""``, ``junk``) is unusable too, naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gdc.versions import Versions
from nvidia_driver.naming import (
    FLATCAR_VERSION_RE,
    KERNEL_RELEASE_RE,
    LTS_STREAM_KEY_RE,
)
from nvidia_driver.sources.flatcar import (
    Channel,
    FlatcarVersion,
    Release,
    entry_problem,
    release_of,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

ALL = "*"  # an exclusion's variant, driver or arch that stands for every one
PINNED = "pinned"  # the stream name of a release covered because versions.toml pins it
CURRENT = "current"
LTS_INFO_URL = "https://lts.release.flatcar-linux.net/lts-info"
LTS_INFO_URL_ENV = "FLATCAR_LTS_INFO_URL"
# Without lts-info: live LTS streams get a release every month or two; 4081's longest gap
# between two releases was 223 days.
LTS_STREAM_MAX_AGE = timedelta(days=240)
# Flatcar's major counts days since 2013-07-01 (CoreOS's scheme): about 365 a year, and 30 to 60
# between two consecutive branches (4547, 4593, 4628 ...). A major more than this above every
# release below it is nearly three years ahead of the feed: a typo, not a release.
MAX_MAJOR_JUMP = 1000
_KERNEL_MAX_LENGTH = 64
_LTS_INFO_LINE = re.compile(r"([0-9]+):([0-9]{4}):(supported|unsupported)")
_CHANNELS = (Channel.ALPHA, Channel.BETA, Channel.STABLE)
_KNOWN_CHANNELS = frozenset({*Channel, "edge"})  # old feeds carry the retired "edge" channel
_SHOWN = 3  # examples a note names before "and N more"


class ReleaseError(LookupError):
    """The feed cannot say what was asked."""


@dataclass(frozen=True)
class Covered:
    """A release to publish images for, and why: the streams it is current for, or pinned."""

    release: Release
    streams: tuple[str, ...]
    superseded: tuple[str, ...] = ()  # what its streams ran before it (:func:`previous`)

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
    # A live release left out for a fault in the feed: its nodes have no image until a person
    # has it fixed (invoke publish fails, naming it), unlike what the matrix leaves out by design.
    blocking: bool = False


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

    def entry(self, version: FlatcarVersion) -> Release | _Unusable:
        """The version's release, or why its entry is unusable."""
        return self.releases.get(version) or self.unusable[version]

    def versions(self, channel: str, major: int | None = None) -> list[FlatcarVersion]:
        """Every version (usable or not) of channel, oldest first."""
        return sorted(v for v in (*self.releases, *self.unusable)
                      if self.entry(v).channel == channel and major in (None, v.major))  # fmt: skip

    def copied_by(self, marker: str) -> FlatcarVersion | None:
        """The newest versioned entry that marker is a copy of."""
        copies = [v for v, entry in self.entries.items() if entry == self.markers[marker]]
        return max(copies, default=None)

    @property
    def newest_date(self) -> datetime | None:
        return max((r.release_date for r in self.releases.values()), default=None)


def _kernel_problem(kernels: object) -> str:
    if isinstance(kernels, str):  # not a list of one: read as none, it would be called missing
        return (f"gives its kernel as the string {kernels[:40]!r}, not a list, in the releases "
                "feed (major_software.kernel)")  # fmt: skip
    if not isinstance(kernels, list) or not kernels:
        return "has no kernel in the releases feed (major_software.kernel)"
    named = [kernel for index, kernel in enumerate(kernels) if kernel not in kernels[:index]]
    if len(named) > 1:
        shown = ", ".join(repr(kernel)[:40] for kernel in named[:_SHOWN])
        return (f"lists {len(named)} kernels in the releases feed (major_software.kernel: "
                f"{shown}): which one its nodes boot is ambiguous")  # fmt: skip
    kernel = named[0]
    if (not isinstance(kernel, str) or len(kernel) > _KERNEL_MAX_LENGTH
            or not KERNEL_RELEASE_RE.fullmatch(kernel)):  # fmt: skip
        return (f"has a kernel {str(kernel)[:40]!r} in the releases feed (major_software.kernel) "
                "that is not a kernel release such as 6.12.102")  # fmt: skip
    return ""


def _entry_problem(entry: object) -> str:
    if not isinstance(entry, Mapping):
        return "the entry is not an object"
    conflicts = [path for path, same in _duplicates(entry) if not same]
    software = entry.get("major_software")
    problem = _kernel_problem(software.get("kernel") if isinstance(software, Mapping) else None)
    if conflicts or problem:
        return problem if not conflicts else (
            f"gives {conflicts[0]} twice with different values in the releases feed: which one "
            "is meant is ambiguous")  # fmt: skip
    return entry_problem(entry)


def _guess_channel(version: FlatcarVersion, entry: object) -> str:
    channel = entry.get("channel") if isinstance(entry, Mapping) else None
    if isinstance(channel, str) and channel:
        return channel
    return str(version.channel) if version.minor < len(_CHANNELS) + 1 else ""


class _Object(dict[str, Any]):
    """A JSON object as parsed, with the keys it gives more than once."""

    repeated: dict[str, bool]  # key -> whether every copy is the same


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    found = _Object()
    found.repeated = {}
    for key, value in pairs:
        if key in found:
            found.repeated[key] = found.repeated.get(key, True) and found[key] == value
        found[key] = value
    return found


def _duplicates(value: object, path: str = "") -> Iterator[tuple[str, bool]]:
    """(where, identical) of every key given twice in value, at any depth."""
    if isinstance(value, _Object):
        for key, same in value.repeated.items():
            yield f"{path}[{json.dumps(key)}]", same
        for key, child in value.items():
            yield from _duplicates(child, f"{path}[{json.dumps(key)}]")
    elif isinstance(value, list):
        for child in value:
            yield from _duplicates(child, path)


def _listed(items: list[str], separator: str = ", ") -> str:
    more = f" (and {len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return separator.join(items[:_SHOWN]) + more


def _plausible(keys: Iterable[str]) -> tuple[set[str], list[str]]:
    """The version keys within reach of the feed's releases, and those skipped (too high).

    Majors in order: one more than MAX_MAJOR_JUMP above the one before starts a new run; the
    run with the most versions is the feed's (the newest such run, on a tie), and every run
    above it is skipped.
    """
    by_major: dict[int, list[str]] = {}
    for key in keys:
        by_major.setdefault(int(key.split(".", 1)[0]), []).append(key)
    runs: list[list[int]] = []
    for major in sorted(by_major):
        if runs and major - runs[-1][-1] <= MAX_MAJOR_JUMP:
            runs[-1].append(major)
        else:
            runs.append([major])
    if not runs:
        return set(), []
    size = [sum(len(by_major[major]) for major in run) for run in runs]
    main = max(range(len(runs)), key=lambda index: (size[index], index))
    kept = {key for run in runs[: main + 1] for major in run for key in by_major[major]}
    skipped = [key for run in runs[main + 1 :] for major in run for key in by_major[major]]
    return kept, skipped


def _version_keys(document: Mapping[str, Any], notes: list[str]) -> dict[str, FlatcarVersion]:
    """The feed's version keys that name a version, each with the version it names."""
    spelled = [key for key in document if FLATCAR_VERSION_RE.fullmatch(key)]
    kept, skipped = _plausible(spelled)
    if skipped:
        notes.append(f"the releases feed has {len(skipped)} version(s) more than "
                     f"{MAX_MAJOR_JUMP} majors above its other releases, skipped as implausible "
                     f"(a typo?): {_listed(sorted(skipped))}")  # fmt: skip
    versions: dict[str, FlatcarVersion] = {}
    read_as, ignored = [], []
    for key in spelled:
        version = FlatcarVersion.parse(key)
        if key not in kept:
            continue
        if str(version) != key:
            if str(version) in document:
                ignored.append(f"{key!r} ({version} is there too)")
                continue
            read_as.append(f"{key!r} as {version}")
        versions[key] = version
    if read_as:
        notes.append(f"the releases feed has version key(s) with a leading zero, read as the "
                     f"version they spell: {_listed(read_as)}")  # fmt: skip
    if ignored:
        notes.append(f"the releases feed has version key(s) with a leading zero, ignored: "
                     f"{_listed(ignored)}")  # fmt: skip
    return versions


def _channel_near_misses(feed: Feed) -> None:
    missed = [f"{release.version} {release.channel!r}" for release in feed.releases.values()
              if release.channel not in _KNOWN_CHANNELS
              and release.channel.strip().lower() in _KNOWN_CHANNELS]  # fmt: skip
    if missed:
        entries = f"{len(missed)} feed entr{'y' if len(missed) == 1 else 'ies'}"
        feed.notes.append(f"{entries} name a channel that differs from a known one only in case "
                          "or spaces, and count as no channel (channel names are exact): "
                          f"{_listed(missed)}")  # fmt: skip


def _document(text: str) -> Mapping[str, Any]:
    try:
        document = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise ReleaseError(f"the Flatcar releases feed is not JSON ({exc}); check "
                           "--releases-url points at a releases.json") from None  # fmt: skip
    if not isinstance(document, Mapping):
        raise ReleaseError("the Flatcar releases feed is not an object keyed by version; check "
                           "--releases-url points at a releases.json")  # fmt: skip
    return document


def _add_entry(feed: Feed, version: FlatcarVersion, entry: Any, *, conflict: bool) -> None:
    feed.entries[version] = entry
    problem = ("is listed twice in the releases feed with different values: which one is "
               "meant is ambiguous") if conflict else _entry_problem(entry)  # fmt: skip
    if problem:
        feed.unusable[version] = _Unusable(version, _guess_channel(version, entry), problem)
    else:
        feed.releases[version] = release_of(version, entry, entry["major_software"]["kernel"][0])


def read_feed(text: str) -> Feed:
    document = _document(text)
    feed = Feed()
    identical = [path for path, same in _duplicates(document) if same]
    if identical:
        feed.notes.append(f"the releases feed gives {len(identical)} key(s) twice, identically: "
                          f"one copy of each is read: {_listed(identical)}")  # fmt: skip
    repeated = document.repeated if isinstance(document, _Object) else {}
    versions = _version_keys(document, feed.notes)
    unknown = []
    for key, entry in document.items():
        conflict = repeated.get(key) is False
        if (key == CURRENT or LTS_STREAM_KEY_RE.fullmatch(key)) and conflict:
            feed.notes.append(f"the releases feed gives its {key!r} marker twice with different "
                              "values: ignored")  # fmt: skip
        elif key == CURRENT or LTS_STREAM_KEY_RE.fullmatch(key):
            feed.markers[key] = entry
        elif key in versions:
            _add_entry(feed, versions[key], entry, conflict=conflict)
        elif not FLATCAR_VERSION_RE.fullmatch(key):
            unknown.append(key)
    if unknown:
        shown = ", ".join(repr(key[:40]) for key in unknown[:5])
        feed.notes.append(f"the releases feed has {len(unknown)} key(s) that are neither a "
                          f"version nor a current marker, ignored: {shown}")  # fmt: skip
    _channel_near_misses(feed)
    return feed


# --- streams -----------------------------------------------------------------------------------

Current = Release | _Unusable


def _channel_current(feed: Feed, channel: str) -> Current | None:
    marked = feed.markers.get(CURRENT)
    if isinstance(marked, Mapping) and marked.get("channel") == channel:
        version = feed.copied_by(CURRENT)
        newest = max(feed.versions(channel), default=None)
        if version is not None and newest is not None and version < newest:
            feed.notes.append(f"the feed's {CURRENT!r} marker copies {channel} {version}, older "
                              f"than its newest {channel} release {newest}: the marker is "
                              f"followed, {channel} moves back (a release pulled?)")  # fmt: skip
        if version is not None:
            return feed.entry(version)
        feed.notes.append(f"the feed's {CURRENT!r} marker copies no versioned {channel} entry: "
                          f"the newest {channel} release is taken instead")  # fmt: skip
    versions = feed.versions(channel)
    if not versions:
        return None
    return feed.entry(versions[-1])


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
                                      "release: check --releases-url", blocking=True))  # fmt: skip
            continue
        streams[stream.name] = feed.entry(versions[-1])
    listed = {f"current-{stream.year}" for stream in info.streams}
    unlisted = sorted(key for key in feed.markers if key != CURRENT and key not in listed)
    if unlisted:
        feed.notes.append("the feed has LTS stream marker(s) lts-info does not list, not "
                          f"covered (lts-info may lag): {_listed(unlisted)}")  # fmt: skip
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
        current = feed.entry(version)
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
            streams[Channel.LTS.value] = feed.entry(versions[-1])
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
                     f"Flatcar {version} ({stream}) {reason}: its nodes get no image until the "
                     "feed is fixed (report it to Flatcar); the first run after that publishes "
                     "it", blocking=True)  # fmt: skip


def previous(feed: Feed, current: Current) -> FlatcarVersion | None:
    """The release of current's channel (LTS: its stream) that current superseded, or None.

    Nodes run it until they have updated, and the GPU Operator may give every node its OS tag
    (gdc.matrix). It is the newest release older than current by version, not by date nor by
    feed order: a JSON object's order means nothing, and several releases of a channel can share
    a date; versions within a channel grow with each release. Only one back: a node whose stream
    published twice before it updated is not served (it updates straight to the current one).
    """
    major = current.version.major if current.channel == Channel.LTS else None
    older = [v for v in feed.versions(current.channel, major) if v < current.version]
    return older[-1] if older else None


def os_versions(covered: Iterable[Covered]) -> tuple[str, ...]:
    """The covered releases and those their streams superseded, oldest first."""
    versions = {v for c in covered for v in (c.version, *c.superseded)}
    return tuple(sorted(versions, key=FlatcarVersion.parse))


def covered_releases(
    feed_text: str, versions: Versions, lts_info: LtsInfo | None = None
) -> tuple[tuple[Covered, ...], tuple[Exclusion, ...], tuple[str, ...]]:
    """The releases to cover (oldest first), those left out with the reason, and notes."""
    feed = read_feed(feed_text)
    current, excluded = current_streams(feed, lts_info, versions.channels)
    named: dict[Release, list[str]] = {}
    superseded: dict[Release, list[str]] = {}
    for stream, entry in current.items():
        if isinstance(entry, Release):
            named.setdefault(entry, []).append(stream)
            before = previous(feed, entry)
            if before is not None:
                superseded.setdefault(entry, []).append(str(before))
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
        shown = _listed([f"{v} {feed.unusable[v].reason}" for v in stale], "; ")
        feed.notes.append(f"{len(stale)} older feed entr{'y' if len(stale) == 1 else 'ies'} "
                          f"cannot be read, ignored: {shown}")  # fmt: skip
    if not named:
        wanted = ", ".join(versions.channels)
        # The first exclusion says why, naming the release and the field (a current stable
        # release with a junk kernel, say); the rest are in the same vein or listed by matrix.
        why = f": {excluded[0].reason}" if excluded else ""
        raise ReleaseError(f"the releases feed covers none of the channels versions.toml lists "
                           f"({wanted}) nor a pinned release{why}; check --releases-url points "
                           "at Flatcar's combined releases.json")  # fmt: skip
    ordered = sorted(named.items(), key=lambda item: item[0].version)
    covered = tuple(Covered(release, tuple(names), tuple(superseded.get(release, ())))
                    for release, names in ordered)  # fmt: skip
    return covered, tuple(excluded), tuple(feed.notes)
