"""Which Flatcar releases to build for, from Flatcar's releases feed (nvidia_driver's parser)."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterable, Mapping

from nvidia_driver.errors import DriverError
from nvidia_driver.flatcar import (
    RELEASES_URL_ENV,
    FlatcarVersion,
    Release,
    current_releases,
    parse_releases,
    releases_url_from_env,
)

FEED_TIMEOUT_SECONDS = 60

FeedReader = Callable[[str], str]


class ReleaseError(LookupError):
    """The feed cannot say what was asked."""


def read_url(url: str) -> str:
    """The feed's text (https, or http/file for mirrors and tests)."""
    if not url.startswith(("https://", "http://", "file://")):
        raise ReleaseError(f"releases feed URL {url!r} is not http(s) or file")
    with urllib.request.urlopen(url, timeout=FEED_TIMEOUT_SECONDS) as response:  # noqa: S310 - scheme checked above
        return str(response.read().decode())


def feed_url(env: Mapping[str, str], override: str = "") -> str:
    """--releases-url, else $FLATCAR_RELEASES_URL, else Flatcar's own feed."""
    return override or releases_url_from_env(env)


def load_feed(url: str, reader: FeedReader = read_url) -> str:
    try:
        return reader(url)
    except OSError as exc:
        raise ReleaseError(
            f"cannot read the Flatcar releases feed {url}: {exc}; set {RELEASES_URL_ENV} or "
            "pass --releases-url for a mirror"
        ) from None


def _parsed(feed: str) -> tuple[Release, ...]:
    try:
        return parse_releases(feed)
    except DriverError as exc:
        raise ReleaseError(str(exc)) from None


def find_release(feed: str, version: str) -> Release:
    """The feed's entry for ``version`` (its kernel names the precompiled tag)."""
    try:
        wanted = FlatcarVersion.parse(version)
    except DriverError as exc:
        raise ReleaseError(str(exc)) from None
    for release in _parsed(feed):
        if release.version == wanted:
            return release
    raise ReleaseError(f"Flatcar {version} is not in the releases feed; check the version")


def current_stable(feed: str) -> Release:
    try:
        current = current_releases(feed)
    except DriverError as exc:
        raise ReleaseError(str(exc)) from None
    if "stable" not in current:
        raise ReleaseError("the releases feed names no current stable release")
    return current["stable"]


def supported_releases(feed: str, channels: Iterable[str]) -> tuple[Release, ...]:
    """The current release of each channel; "lts" stands for every LTS stream."""
    try:
        current = current_releases(feed)
    except DriverError as exc:
        raise ReleaseError(str(exc)) from None
    wanted = set(channels)
    chosen = [
        release
        for stream, release in current.items()
        if stream in wanted or ("lts" in wanted and stream.startswith("lts"))
    ]
    return tuple(sorted(set(chosen), key=lambda release: release.version))
