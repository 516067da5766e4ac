from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from nvidia_driver.errors import DriverError
from nvidia_driver.naming import arch_of, kernel_release_from_feed
from nvidia_driver.sources.flatcar import (
    DEFAULT_RELEASE_BASE_URL,
    DEFAULT_RELEASES_URL,
    Artifact,
    Channel,
    FlatcarVersion,
    ReleaseServer,
    board_of,
    parse_releases,
    parse_shell_assignments,
    release_server_from_env,
    releases_url_from_env,
)

# --- versions, channels, boards ------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "channel"),
    [
        ("4790.0.0", Channel.ALPHA),
        ("4694.0.1", Channel.ALPHA),
        ("4757.1.0", Channel.BETA),
        ("4593.2.5", Channel.STABLE),
        ("4081.3.10", Channel.LTS),
    ],
)
def test_channel_of(version: str, channel: Channel) -> None:
    assert FlatcarVersion.parse(version).channel == channel


@pytest.mark.parametrize("version", ["4593.2", "stable", "current", "4593.2.5+nightly-1", ""])
def test_malformed_version_is_refused(version: str) -> None:
    with pytest.raises(DriverError) as caught:
        FlatcarVersion.parse(version)
    message = str(caught.value)
    assert message.startswith(f"invalid Flatcar version {version!r}: expected MAJOR.MINOR.PATCH")
    assert "\n" not in message


def test_minor_without_channel_is_refused() -> None:
    with pytest.raises(DriverError, match=r"4593\.4\.0: minor 4 names no channel"):
        _ = FlatcarVersion.parse("4593.4.0").channel


def test_versions_order_numerically() -> None:
    versions = ["4081.3.10", "4081.3.9", "4593.2.5", "3975.2.2"]
    ordered = sorted(FlatcarVersion.parse(version) for version in versions)
    assert [str(version) for version in ordered] == [
        "3975.2.2",
        "4081.3.9",
        "4081.3.10",
        "4593.2.5",
    ]


@pytest.mark.parametrize(
    ("arch", "board", "name"),
    [
        ("amd64", "amd64-usr", "amd64"),
        ("x86_64", "amd64-usr", "amd64"),
        ("arm64", "arm64-usr", "arm64"),
        ("aarch64", "arm64-usr", "arm64"),
    ],
)
def test_board_of(arch: str, board: str, name: str) -> None:
    assert board_of(arch) == board
    assert arch_of(arch) == name


def test_unknown_arch_is_refused() -> None:
    with pytest.raises(DriverError, match=r"unsupported architecture 'riscv64': .*amd64"):
        board_of("riscv64")


# --- release server ------------------------------------------------------------------------


def test_stable_amd64_kernel_image_url() -> None:
    server = ReleaseServer()
    assert server.artifact_url("4593.2.5", "amd64", Artifact.KERNEL_IMAGE) == (
        "https://stable.release.flatcar-linux.net/amd64-usr/4593.2.5/"
        "flatcar_production_image.vmlinuz"
    )


def test_lts_arm64_developer_container_urls() -> None:
    server = ReleaseServer()
    base = "https://lts.release.flatcar-linux.net/arm64-usr/4081.3.10/"
    name = Artifact.DEVELOPER_CONTAINER
    assert server.release_url("4081.3.10", "aarch64") == base
    assert server.artifact_url("4081.3.10", "arm64", name) == (
        base + "flatcar_developer_container.bin.bz2"
    )


def test_mirror_template_keeps_the_channel_split() -> None:
    server = ReleaseServer("http://127.0.0.1:8080/flatcar/{channel}/")
    assert server.artifact_url("4790.0.0", "amd64", "version.txt") == (
        "http://127.0.0.1:8080/flatcar/alpha/amd64-usr/4790.0.0/version.txt"
    )


@pytest.mark.parametrize(
    "template",
    [
        "https://mirror.example/flatcar",
        "https://{channel}.example/{board}",
        "https://{channel!r}.example",
        "https://{channel}.example/{",
        "https://{}.example",
    ],
)
def test_template_must_hold_exactly_the_channel(template: str) -> None:
    with pytest.raises(DriverError, match="invalid release server URL template"):
        ReleaseServer(template)


def test_release_urls_refuse_a_bad_version() -> None:
    with pytest.raises(DriverError, match="invalid Flatcar version 'current'"):
        ReleaseServer().release_url("current", "amd64")


def test_urls_from_the_environment() -> None:
    assert release_server_from_env({}) == ReleaseServer(DEFAULT_RELEASE_BASE_URL)
    assert release_server_from_env({"FLATCAR_RELEASE_BASE_URL": ""}).base_url == (
        DEFAULT_RELEASE_BASE_URL
    )
    mirror = "https://mirror.example/{channel}"
    assert release_server_from_env({"FLATCAR_RELEASE_BASE_URL": mirror}).base_url == mirror
    assert releases_url_from_env({}) == DEFAULT_RELEASES_URL
    feed = "http://127.0.0.1/releases.json"
    assert releases_url_from_env({"FLATCAR_RELEASES_URL": feed}) == feed


# --- version.txt ---------------------------------------------------------------------------

VERSION_TXT_4593_2_5 = """\
FLATCAR_BUILD=4593
FLATCAR_BRANCH=2
FLATCAR_PATCH=5
FLATCAR_VERSION_RE=4593.2.5
FLATCAR_VERSION_ID=4593.2.5
FLATCAR_BUILD_ID="2026-08-11-2350"
FLATCAR_SDK_VERSION=4593.0.0
"""


def test_shell_assignments_keep_every_key() -> None:
    values = parse_shell_assignments(VERSION_TXT_4593_2_5 + "\n# comment\n")
    assert values["FLATCAR_BRANCH"] == "2"
    assert len(values) == 7


@pytest.mark.parametrize(
    "line", ["<html><body>404</body></html>", 'FLATCAR_BUILD_ID="unterminated']
)
def test_version_txt_that_is_not_one(line: str) -> None:
    with pytest.raises(DriverError, match=r"version\.txt line 2: "):
        parse_shell_assignments(f"FLATCAR_BUILD=4593\n{line}\n")


# --- releases.json -------------------------------------------------------------------------


def _entry(channel: str, released: str, kernel: str) -> dict[str, Any]:
    return {
        "channel": channel,
        "architectures": ["amd64", "arm64"],
        "release_date": released,
        "major_software": {
            "containerd": ["2.1.5"],
            "kernel": [kernel],
            "systemd": ["257"],
        },
        "release_notes": " _Changes since **Stable 4593.2.4**_\n",
    }


def _feed() -> dict[str, Any]:
    """A cut of the combined releases.json (values from flatcar-releases-recent.tsv)."""
    feed = {
        "4081.3.9": _entry("lts", "2026-07-09 11:02:41 +0000", "6.6.144"),
        "4081.3.10": _entry("lts", "2026-08-13 09:14:05 +0000", "6.6.150"),
        "3510.3.8": _entry("lts", "2025-08-19 12:00:00 +0000", "5.15.189"),  # illustrative
        "4593.2.4": _entry("stable", "2026-07-09 10:57:13 +0000", "6.12.95"),
        "4593.2.5": _entry("stable", "2026-08-13 09:26:25 +0000", "6.12.102"),
        "4722.1.0": _entry("beta", "2026-07-09 10:59:02 +0000", "6.12.95"),
        "4757.1.0": _entry("beta", "2026-08-13 09:20:44 +0000", "6.12.102"),
        "4757.0.0": _entry("alpha", "2026-07-13 15:40:11 +0000", "6.12.95"),
        "4790.0.0": _entry("alpha", "2026-08-13 09:23:30 +0000", "6.12.102"),
    }
    feed["current"] = copy.deepcopy(feed["4593.2.5"])
    feed["current-2024"] = copy.deepcopy(feed["4081.3.10"])
    feed["current-2023"] = copy.deepcopy(feed["3510.3.8"])
    return feed


def test_feed_releases() -> None:
    releases = parse_releases(json.dumps(_feed()))
    assert [str(release.version) for release in releases] == [
        "3510.3.8",
        "4081.3.9",
        "4081.3.10",
        "4593.2.4",
        "4593.2.5",
        "4722.1.0",
        "4757.0.0",
        "4757.1.0",
        "4790.0.0",
    ]
    stable = releases[4]
    assert stable.channel == "stable"
    assert stable.kernel_release == "6.12.102-flatcar"
    assert stable.arches == ("amd64", "arm64")
    assert stable.release_date == datetime(2026, 8, 13, 9, 26, 25, tzinfo=UTC)


def test_release_without_kernel_is_named() -> None:
    feed = _feed()
    feed["4593.2.5"]["major_software"]["kernel"] = []
    with pytest.raises(DriverError) as caught:
        parse_releases(feed)
    message = str(caught.value)
    assert message.startswith("releases feed: release 4593.2.5: has no major_software.kernel; ")
    assert "FLATCAR_RELEASES_URL" in message


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda entry: entry.pop("channel"), "has no channel"),
        (lambda entry: entry.update(architectures="amd64"), "its architectures is not a list"),
        (lambda entry: entry.update(release_date="13 Aug 2026"), "its release_date '13 Aug 2026'"),
        (lambda entry: entry.pop("major_software"), "has no major_software.kernel"),
    ],
)
def test_malformed_release_is_named(change: Any, reason: str) -> None:
    feed = _feed()
    change(feed["4790.0.0"])
    with pytest.raises(DriverError, match=f"release 4790.0.0: {reason}"):
        parse_releases(feed)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<html>", "releases feed: not JSON"),
        ("[]", "releases feed: unexpected top level"),
        ('{"4593.2.5": "stable"}', "releases feed: release 4593.2.5: entry is not an object"),
    ],
)
def test_malformed_feed(text: str, reason: str) -> None:
    with pytest.raises(DriverError, match=reason):
        parse_releases(text)


@pytest.mark.parametrize(
    ("feed_kernel", "release"),
    [
        ("6.12.102", "6.12.102-flatcar"),
        ("5.15.189", "5.15.189-flatcar"),
        ("6.12.95+deb12-cloud-amd64", "6.12.95+deb12-cloud-amd64"),
        ("6.6.150-flatcar", "6.6.150-flatcar"),
    ],
)
def test_kernel_release_from_the_feeds_kernel(feed_kernel: str, release: str) -> None:
    assert kernel_release_from_feed(feed_kernel) == release
