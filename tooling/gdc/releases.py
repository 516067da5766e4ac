"""Flatcar's releases feed and lts-info, read for the tooling (:mod:`gdc.coverage` parses them)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from gdc.coverage import LTS_INFO_URL, LTS_INFO_URL_ENV, LtsInfo, ReleaseError, parse_lts_info
from gdc.coverage import read_feed as _read_feed
from nvidia_driver.errors import DriverError
from nvidia_driver.limits import FEED
from nvidia_driver.settings import FLATCAR_RELEASES_URL
from nvidia_driver.sources.download import Downloader, feed_downloader
from nvidia_driver.sources.flatcar import Channel, FlatcarVersion, Release, releases_url_from_env

__all__ = [
    "FeedReader", "ReleaseError", "current_stable", "find_release", "load_feed", "read_text",
]  # fmt: skip

FeedReader = Callable[[str], str]


def read_text(url: str, downloader: Downloader | None = None) -> str:
    """A Flatcar feed (releases.json, lts-info), read as the reboot gate reads it."""
    return (downloader or feed_downloader(os.environ)).get_text(url, FEED, "a Flatcar feed")


def feed_url(env: Mapping[str, str], override: str = "") -> str:
    """--releases-url, else $FLATCAR_RELEASES_URL, else Flatcar's own feed."""
    return override or releases_url_from_env(env)


def load_feed(url: str, reader: FeedReader = read_text) -> str:
    try:
        return reader(url)
    except DriverError as exc:
        raise ReleaseError(
            f"cannot read the Flatcar releases feed ({exc}); set {FLATCAR_RELEASES_URL} or pass "
            "--releases-url for a mirror"
        ) from None


def lts_info(env: Mapping[str, str], reader: FeedReader = read_text, override: str = "") -> (
    LtsInfo
):  # fmt: skip
    """lts-info (--lts-info-url, else $FLATCAR_LTS_INFO_URL, else Flatcar's own), or why it could
    not be read (the matrix then judges LTS streams by age)."""
    url = override or env.get(LTS_INFO_URL_ENV) or LTS_INFO_URL
    try:
        return LtsInfo(parse_lts_info(reader(url)))
    except (DriverError, ReleaseError) as exc:
        return LtsInfo(unavailable=f"{url}: {exc}")


def find_release(feed: str, version: str) -> Release:
    """The feed's entry for ``version`` (its kernel names the precompiled tag)."""
    try:
        wanted = FlatcarVersion.parse(version)
    except DriverError as exc:
        raise ReleaseError(str(exc)) from None
    parsed = _read_feed(feed)
    if wanted in parsed.releases:
        return parsed.releases[wanted]
    if wanted in parsed.unusable:
        raise ReleaseError(f"Flatcar {version} {parsed.unusable[wanted].reason}: it cannot be "
                           "built until the feed is fixed")  # fmt: skip
    raise ReleaseError(f"Flatcar {version} is not in the releases feed; check the version")


def current_stable(feed: str) -> Release:
    parsed = _read_feed(feed)
    versions = parsed.versions(Channel.STABLE)
    marked = parsed.copied_by("current") if "current" in parsed.markers else None
    newest = marked if marked is not None and marked in parsed.releases else None
    if newest is None and versions:
        newest = versions[-1]
    if newest is None or newest not in parsed.releases:
        why = parsed.unusable[newest].reason if newest in parsed.unusable else "is not there"
        raise ReleaseError(f"the releases feed's current stable release {why}; pass "
                           "--flatcar-version")  # fmt: skip
    return parsed.releases[newest]
