"""Flatcar release facts: channels, boards, release-server URLs, what each release's kernel trees
are, version.txt-style files and releases.json.

Nothing here touches the network: callers fetch, these functions name and parse.
"""

from __future__ import annotations

import os
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from nvidia_driver.errors import DriverError
from nvidia_driver.formats import jsontext
from nvidia_driver.naming import (
    FLATCAR_VERSION_RE,
    arch_of,
    kernel_release_from_feed,
)
from nvidia_driver.settings import FLATCAR_RELEASE_BASE_URL, FLATCAR_RELEASES_URL

DEFAULT_RELEASE_BASE_URL = "https://{channel}.release.flatcar-linux.net"
DEFAULT_RELEASES_URL = "https://www.flatcar.org/releases-json/releases.json"


class Channel(StrEnum):
    ALPHA = "alpha"
    BETA = "beta"
    STABLE = "stable"
    LTS = "lts"


_CHANNEL_BY_MINOR = (Channel.ALPHA, Channel.BETA, Channel.STABLE, Channel.LTS)


class Artifact(StrEnum):
    """Files of one release on the release server that the build tooling uses."""

    CONTAINER_TARBALL = "flatcar-container.tar.gz"
    KERNEL_IMAGE = "flatcar_production_image.vmlinuz"
    DEVELOPER_CONTAINER = "flatcar_developer_container.bin.bz2"


@dataclass(frozen=True, order=True)
class FlatcarVersion:
    """MAJOR.MINOR.PATCH; ordering is numeric, so 4081.3.10 sorts after 4081.3.9."""

    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> FlatcarVersion:
        match = FLATCAR_VERSION_RE.fullmatch(text.strip())
        if match is None:
            raise DriverError(
                f"invalid Flatcar version {text!r}: expected MAJOR.MINOR.PATCH such as 4593.2.5; "
                "pass a release version, not a channel name or a nightly build id"
            )
        major, minor, patch = (int(part) for part in match.groups())
        return cls(major, minor, patch)

    @property
    def channel(self) -> Channel:
        """X.0.Y is alpha, X.1.Y beta, X.2.Y stable, X.3.Y lts."""
        if self.minor >= len(_CHANNEL_BY_MINOR):
            raise DriverError(
                f"invalid Flatcar version {self}: minor {self.minor} names no channel "
                "(0 alpha, 1 beta, 2 stable, 3 lts); check the version"
            )
        return _CHANNEL_BY_MINOR[self.minor]

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def board_of(arch: str) -> str:
    """The release server's board of an architecture (uname -m names are accepted)."""
    return f"{arch_of(arch)}-usr"


def _is_channel_template(template: str) -> bool:
    """True if ``template`` has {channel} fields, plain ones, and no other field."""
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError:  # a lone brace
        return False
    return bool(fields) and all(field == ("channel", "", None) for field in fields)


@dataclass(frozen=True)
class ReleaseServer:
    """Where release artifacts live: <base_url>/<board>/<version>/<artifact>.

    ``base_url`` is a template with a ``{channel}`` field so that a mirror (or a test server)
    can keep the per-channel split of the official hosts.
    """

    base_url: str = DEFAULT_RELEASE_BASE_URL

    def __post_init__(self) -> None:
        if not _is_channel_template(self.base_url):
            raise DriverError(
                f"invalid release server URL template {self.base_url!r}: it must contain "
                "{channel} and no other field; e.g. "
                f"{DEFAULT_RELEASE_BASE_URL} (set {FLATCAR_RELEASE_BASE_URL})"
            )

    def release_url(self, version: str, arch: str) -> str:
        """The directory of one release, with a trailing slash."""
        parsed = FlatcarVersion.parse(version)
        base = self.base_url.format(channel=parsed.channel).rstrip("/")
        return f"{base}/{board_of(arch)}/{parsed}/"

    def artifact_url(self, version: str, arch: str, name: str) -> str:
        return self.release_url(version, arch) + name


def release_server_from_env(env: Mapping[str, str]) -> ReleaseServer:
    return ReleaseServer(env.get(FLATCAR_RELEASE_BASE_URL) or DEFAULT_RELEASE_BASE_URL)


def releases_url_from_env(env: Mapping[str, str]) -> str:
    return env.get(FLATCAR_RELEASES_URL) or DEFAULT_RELEASES_URL


# --- what each release offers to build against ----------------------------------------------

# The first release of each channel whose kernel tree is made by the kernel's
# install-extmod-build, complete, in the node's /usr/lib/modules and in flatcar-container.tar.gz,
# with host tools built for the release's own architecture (Flatcar's coreos-modules ebuild;
# flatcar/scripts changelog 2025-03-07-coreos-modules-cross-compilation.md; flatcar.md §5.2).
# LTS releases are cut from a stable major: every LTS of 4230 or later has it. Before (LTS
# 4081), the tree has the older split layout, a cleaned build/ and a stripped source/: a node
# uses it as it is, an image build takes the developer container's; on arm64 its host tools
# (fixdep, modpost) are x86-64 binaries, so no module can be built from it. (Flatcar's
# releases.json and the toolchain table list no LTS after 4081.3.10 yet.)
FIRST_CONTAINER_TREE = {
    "alpha": FlatcarVersion(4277, 0, 0),
    "beta": FlatcarVersion(4230, 1, 0),
    "stable": FlatcarVersion(4230, 2, 0),
    "lts": FlatcarVersion(4230, 3, 0),
}


def has_container_tree(version: str) -> bool:
    """Whether the release's trees are install-extmod-build's (its tarball then carries one)."""
    parsed = FlatcarVersion.parse(version)
    first = FIRST_CONTAINER_TREE.get(str(parsed.channel))
    return first is not None and parsed >= first


def has_native_host_tools(version: str, arch: str) -> bool:
    """Whether the release's kernel trees can build modules on arch: false on arm64 before
    4230.1.0, whose trees carry x86-64 host tools (flatcar/scripts#2694)."""
    return arch != "arm64" or has_container_tree(version)


# --- version.txt -------------------------------------------------------------------------------


def parse_shell_assignments(text: str, *, source: str = "version.txt") -> dict[str, str]:
    """KEY=value lines as build_image writes them; values may be single- or double-quoted."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True, posix=True)
        except ValueError as exc:
            raise DriverError(f"{source} line {number}: cannot parse {line!r}: {exc}") from None
        if len(words) != 1 or "=" not in words[0]:
            raise DriverError(
                f"{source} line {number}: expected KEY=value, got {line!r}; "
                "check that the file is a Flatcar version.txt"
            )
        key, value = words[0].split("=", 1)
        values[key] = value
    return values


# --- /usr/share/flatcar/release: what a release's own files say they are ----------------------

# Written into every Flatcar root by flatcar/scripts build_library/set_lsb_release, so both
# flatcar-container.tar.gz and the developer container carry it; nothing else a release
# publishes names the release and is covered by its signature.
RELEASE_FILE = "usr/share/flatcar/release"
_RELEASE_FILE_LIMIT = 4096


def check_release_file(root: Path, version: str, arch: str, artifact: str) -> None:
    """Refuse an unpacked artifact whose /usr/share/flatcar/release names another release.

    The signature proves Flatcar made the file, not for which release: a mirror or proxy could
    serve an older release's signed file, with its DIGESTS and signature, under this URL.
    """
    wanted = (str(FlatcarVersion.parse(version)), board_of(arch))
    path = root / RELEASE_FILE
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as file:
            text = file.read(_RELEASE_FILE_LIMIT).decode("utf-8", errors="replace")
    except OSError as exc:
        raise DriverError(
            f"{artifact} has no readable /{RELEASE_FILE} ({exc.strerror or exc}), so it cannot "
            f"be tied to Flatcar {wanted[0]}: refusing it; check the release URL and mirror"
        ) from exc
    values = parse_shell_assignments(text, source=f"/{RELEASE_FILE} of {artifact}")
    found = (values.get("FLATCAR_RELEASE_VERSION", ""), values.get("FLATCAR_RELEASE_BOARD", ""))
    if found != wanted:
        raise DriverError(
            f"{artifact} is signed by Flatcar but is the file of Flatcar {found[0] or '?'} "
            f"({found[1] or '?'}), not of {wanted[0]} ({wanted[1]}): the mirror or a proxy served "
            "another release's file under this URL; refusing it"
        )


# --- releases.json -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    version: FlatcarVersion
    channel: str  # as the feed says; old feeds also carry "edge"
    kernel_release: str  # uname -r, e.g. 6.12.81-flatcar
    arches: tuple[str, ...]
    release_date: datetime


_FEED_FIX = f"check {FLATCAR_RELEASES_URL} points at a Flatcar releases.json"


RELEASE_DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"  # what releases_as_json.py writes with strftime


def _feed_error(what: str, why: str) -> DriverError:
    return DriverError(f"releases feed: {what}: {why}; {_FEED_FIX}")


def entry_problem(entry: Mapping[str, Any]) -> str:
    """What keeps a feed entry's channel, architectures or date from being read, else "". Its
    kernel each reader checks its own way (the gate takes the first, the tooling wants one)."""
    if not isinstance(entry.get("channel"), str) or not entry["channel"]:
        return "has no channel"
    arches = entry.get("architectures")
    if not isinstance(arches, list) or not all(isinstance(arch, str) for arch in arches):
        return "its architectures is not a list of names"
    date = str(entry.get("release_date"))
    try:
        datetime.strptime(date, RELEASE_DATE_FORMAT)  # noqa: DTZ007 - the format has %z
    except ValueError:
        return f"its release_date {date[:40]!r} is not 'YYYY-MM-DD HH:MM:SS +ZZZZ'"
    return ""


def release_of(version: FlatcarVersion, entry: Mapping[str, Any], kernel: str) -> Release:
    """The release an entry without a problem (:func:`entry_problem`) describes."""
    released = datetime.strptime(entry["release_date"], RELEASE_DATE_FORMAT)  # noqa: DTZ007
    arches = tuple(entry["architectures"])
    return Release(version, entry["channel"], kernel_release_from_feed(kernel), arches, released)


def _parse_entry(key: str, entry: object) -> Release:
    if not isinstance(entry, Mapping):
        raise _feed_error(f"release {key}", "entry is not an object")
    software = entry.get("major_software")
    kernels = software.get("kernel") if isinstance(software, Mapping) else None
    if not isinstance(kernels, list) or not kernels or not isinstance(kernels[0], str):
        raise _feed_error(f"release {key}", "has no major_software.kernel")
    problem = entry_problem(entry)
    if problem:
        raise _feed_error(f"release {key}", problem)
    return release_of(FlatcarVersion.parse(key), entry, kernels[0])


def parse_releases(feed: str | Mapping[str, Any]) -> tuple[Release, ...]:
    """Every versioned release in the feed, oldest first. The feed's `current`,
    `current-2024`, ... markers, copies of a versioned entry, are skipped (the tooling reads
    them: gdc.coverage)."""
    if isinstance(feed, str):
        feed = jsontext.parse(feed, "releases feed", _FEED_FIX)
    if not isinstance(feed, Mapping):
        raise _feed_error("unexpected top level", "expected an object keyed by version")
    releases = [
        _parse_entry(key, entry) for key, entry in feed.items() if FLATCAR_VERSION_RE.fullmatch(key)
    ]
    return tuple(sorted(releases, key=lambda release: release.version))
