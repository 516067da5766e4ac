"""A releases.json in the real feed's shape, made from flatcar-releases-recent.tsv.

The TSV (resources/, a copy of the project's reference data) lists version, channel, date,
kernel, arches, systemd and containerd of every release since 3975. The feed adds what
Flatcar's releases_as_json.py adds: ``current`` (stable's current release) and one
``current-<year>`` marker per LTS stream.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

RECENT_TSV = Path(__file__).with_name("resources") / "flatcar-releases-recent.tsv"
LTS_STREAMS = {"4081": "2024"}  # LTS major -> stream year (lts-info)
# lts-info (https://lts.release.flatcar-linux.net/lts-info): major:year:supported|unsupported,
# as flatcar/scripts ci-automation/vendor-testing/qemu_update.sh reads it; the dead streams are
# the ones releases.json still keeps markers for (current-2021 ... current-2023).
LTS_INFO = {"2605": ("2021", False), "3033": ("2022", False), "3510": ("2023", False),
            "4081": ("2024", True)}  # fmt: skip


def lts_info_text(streams: dict[str, tuple[str, bool]] | None = None) -> str:
    chosen = LTS_INFO if streams is None else streams
    return "".join(f"{major}:{year}:{'supported' if live else 'unsupported'}\n"
                   for major, (year, live) in chosen.items())  # fmt: skip


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def feed_entry(channel: str, date: str, kernel: str | None, arches: str = "amd64,arm64", *,
               systemd: str = "257", containerd: str = "2.1.5") -> dict[str, Any]:  # fmt: skip
    software: dict[str, list[str]] = {"systemd": [systemd], "containerd": [containerd]}
    if kernel is not None:
        software["kernel"] = [kernel]
    return {
        "channel": channel,
        "architectures": arches.split(","),
        "release_date": f"{date} 12:00:00 +0000",
        "major_software": software,
        "release_notes": "",
    }


def feed_from_tsv(path: Path = RECENT_TSV) -> dict[str, Any]:
    feed: dict[str, Any] = {}
    with path.open(newline="") as rows:
        for row in csv.DictReader(rows, delimiter="\t"):
            feed[row["version"]] = feed_entry(
                row["channel"], row["release_date"], row["kernel"], row["archs"],
                systemd=row["systemd"], containerd=row["containerd"],
            )  # fmt: skip
    return with_markers(feed)


def with_markers(feed: dict[str, Any]) -> dict[str, Any]:
    """(Re)compute ``current`` and the ``current-<year>`` markers from the versioned entries."""
    versions = sorted((key for key in feed if key[0].isdigit()), key=_version_key)
    marked = {key: value for key, value in feed.items() if not key.startswith("current")}
    stable = [v for v in versions if feed[v]["channel"] == "stable"]
    if stable:
        marked["current"] = feed[stable[-1]]
    for major, year in LTS_STREAMS.items():
        stream = [v for v in versions if v.startswith(f"{major}.3.")]
        if stream:
            marked[f"current-{year}"] = feed[stream[-1]]
    return marked
