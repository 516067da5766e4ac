"""NVIDIA's own files, read for the tooling: from NVIDIA's hosts only, bounded, one error type.

What the tooling reads, and where NVIDIA publishes it (the defaults; a mirror or a test server
replaces the base URLs, and ``NVIDIA_DRIVER_REDIRECT_HOSTS`` then names the hosts to trust):

* ``NVIDIA-Linux-<x86_64|aarch64>-<version>.run.sha256sum`` beside each ``.run`` under
  ``download.nvidia.com/XFree86/Linux-<x86_64|aarch64>/<version>/``: one line as ``sha256sum``
  writes it, ``<64 hex>  NVIDIA-Linux-x86_64-<version>.run`` (NVIDIA's 580.159.03 file, as
  public repositories quote it; packagers verify downloads against it);
* the ``.run`` itself, for ``--verify``: the datacenter copy under
  ``us.download.nvidia.com/tesla/<version>/``, which the image build downloads
  (images/build/Dockerfile's DRIVER_BASE_URL);
* ``redistrib_<version>.json`` under ``developer.download.nvidia.com/compute/nvidia-driver/
  redist/``: ``release_date``, ``release_label`` (the driver version), ``release_product``, and
  per component ``name``, ``license``, ``version`` and per platform (``linux-x86_64``,
  ``linux-sbsa``) ``relative_path``, ``sha256``, ``md5``, ``size`` (NVIDIA's driver installation
  guide, "Tarballs and Zip Archive Deliverables"; the schema ConnorBaker/cuda-packages
  ``cuda_redist/nvidia_index.py`` validates NVIDIA's manifests against);
* ``docs.nvidia.com/datacenter/tesla/drivers/releases.json``, NVIDIA's machine-readable list of
  datacenter driver releases ("The release information can be scraped by automation tools ...
  releases.json", docs.nvidia.com/datacenter/tesla/drivers/, "Supported Drivers and CUDA
  Toolkit Versions"): ``{"<branch>": {"type": "lts branch" | "production branch" | "new
  feature branch", "driver_info": [{"release_version", "release_date", "release_notes",
  "architectures", "runfile_url": {"x86_64": URL, "aarch64": URL}}, ...]}}``.

Every read is bounded in bytes and time; a small file (a checksum, a manifest, the list) within
one deadline for all its tries (:data:`SMALL_DEADLINE_SECONDS`), so that a server that
trickles it cannot hold a run for the .run's. JSON that gives a key twice is refused (which copy
is meant?), and the list's words (a branch's type, a date, a URL) are kept as
:func:`nvidia_driver.safetext.shown` shows them: no line break or control character of NVIDIA's
reaches a log line, a workflow command or a pull request.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nvidia_driver.digests import valid_sha256
from nvidia_driver.errors import DriverError
from nvidia_driver.image import provision
from nvidia_driver.naming import (
    DRIVER_VERSION_RE,
    MACHINE,
    driver_key,
    driver_url,
    redist_manifest_url,
    run_name,
)
from nvidia_driver.safetext import shown
from nvidia_driver.sources.download import CHUNK, Opened
from nvidia_driver.sources.exchange import host_matches

CHECKSUM_BASE_URL = "https://download.nvidia.com/XFree86"
SMALL_DEADLINE_SECONDS = 120.0  # every try of a small file: a checksum, a manifest, the list
DRIVER_BASE_URL = "https://us.download.nvidia.com/tesla"
REDIST_BASE_URL = "https://developer.download.nvidia.com/compute/nvidia-driver/redist"
RELEASES_URL = "https://docs.nvidia.com/datacenter/tesla/drivers/releases.json"
# The image build's download hosts (provision.py), and the documentation host of the list.
NVIDIA_HOSTS = (*provision.NVIDIA_REDIRECT_HOSTS, "docs.nvidia.com")
MAX_CHECKSUM_BYTES = 4 << 10  # one line
MAX_MANIFEST_BYTES = provision.MAX_MANIFEST_BYTES
MAX_RELEASES_BYTES = 8 << 20  # a list of releases as text; far past this it is not one
MAX_RUN_BYTES = 2 << 30  # a .run is about 400 MB
# A line as sha256sum writes it: the digest (checked by nvidia_driver.digests), a space, then
# " " or "*" (text or binary mode) and the file's name.
_SUM_LINE = re.compile(r"(?P<sha256>\S+) [ *](?P<name>\S+)")


class RecordError(Exception):
    """NVIDIA's files were not read, or were refused, or versions.toml was not written."""


def check_release(version: str) -> str:
    if not DRIVER_VERSION_RE.fullmatch(version):
        raise RecordError(
            f"{version!r} is not an NVIDIA datacenter driver version such as 580.178.04"
        )
    return version


@dataclass(frozen=True)
class NvidiaUpstream:
    """Where the tooling reads NVIDIA's files, as plan.Upstream is where the image builds
    download from: the base URLs ("" keeps NVIDIA's own)."""

    checksum_base_url: str = ""
    driver_base_url: str = ""
    redist_base_url: str = ""
    releases_url: str = ""

    def checksum_url(self, version: str, arch: str) -> str:
        base = (self.checksum_base_url or CHECKSUM_BASE_URL).rstrip("/")
        return f"{base}/Linux-{MACHINE[arch]}/{version}/{run_name(version, arch)}.sha256sum"

    def run_url(self, version: str, arch: str) -> str:
        return driver_url(self.driver_base_url or DRIVER_BASE_URL, version, arch)

    def manifest_url(self, version: str) -> str:
        return redist_manifest_url(self.redist_base_url or REDIST_BASE_URL, version)

    def releases_list_url(self) -> str:
        return self.releases_url or RELEASES_URL


class Nvidia:
    """Reads URLs on NVIDIA's hosts (or those NVIDIA_DRIVER_REDIRECT_HOSTS names), bounded in
    bytes and time (nvidia_driver.sources.download), and no others, redirects included."""

    def __init__(
        self, env: Mapping[str, str] | None = None, small_deadline: float = SMALL_DEADLINE_SECONDS
    ) -> None:
        try:
            self._downloader = provision.downloader(env, hosts=NVIDIA_HOSTS)
        except DriverError as exc:
            raise RecordError(str(exc)) from None
        limits = self._downloader.limits
        self._small = dataclasses.replace(  # every try of a small file within one deadline
            self._downloader,
            limits=dataclasses.replace(limits, deadline=min(limits.deadline, small_deadline)),
        )

    @property
    def hosts(self) -> tuple[str, ...]:
        return self._downloader.limits.redirect_hosts

    def check(self, url: str) -> None:
        """Refuse a URL that is not http(s) on one of the trusted hosts, before any request."""
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme not in {"https", "http"} or not any(
            host_matches(host, pattern) for pattern in self.hosts
        ):
            raise RecordError(
                f"refusing {url}: {host or 'it'} is not one of NVIDIA's hosts "
                f"({', '.join(self.hosts)}); for a mirror you trust, list its host in "
                "NVIDIA_DRIVER_REDIRECT_HOSTS"
            )

    def text(self, url: str, limit: int, what: str) -> str:
        self.check(url)
        try:
            return self._small.get_text(url, limit, what)
        except DriverError as exc:
            raise RecordError(str(exc)) from None

    def json(self, url: str, limit: int, what: str) -> Any:
        try:
            return json.loads(self.text(url, limit, what), object_pairs_hook=_once(url))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise RecordError(f"{url} is not JSON ({exc}): not {what}") from None

    def sha256(self, url: str) -> str:
        """The SHA-256 of the file at url, streamed, never stored."""
        self.check(url)

        def digest(opened: Opened) -> str:
            hashed, size = hashlib.sha256(), 0
            while chunk := opened.read(CHUNK):
                size += len(chunk)
                if size > MAX_RUN_BYTES:
                    raise DriverError(f"{url} is over {MAX_RUN_BYTES} bytes: not a driver .run")
                hashed.update(chunk)
            opened.check_complete(size)
            return hashed.hexdigest()

        try:
            return self._downloader.transfer(url, digest)
        except DriverError as exc:
            raise RecordError(str(exc)) from None


def _once(url: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A JSON object hook that refuses a key given twice (json.loads would keep the last)."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                raise RecordError(f"{url} gives {shown(key, 80)!r} twice in one object: which "
                                  "copy is meant is ambiguous; nothing was written")  # fmt: skip
            found[key] = value
        return found

    return hook


def parse_checksum_file(text: str, name: str, url: str) -> str:
    """The SHA-256 a ``.sha256sum`` file gives for ``name``; refused if it names another file."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    match = _SUM_LINE.fullmatch(lines[0]) if len(lines) == 1 else None
    try:
        sha256 = valid_sha256(match["sha256"], url) if match else None
    except DriverError:
        sha256 = None
    if match is None or sha256 is None:
        raise RecordError(
            f"{url} is not one sha256sum line ('<64 hex digits>  {name}'): {text[:120]!r}"
        )
    if match["name"] != name:
        raise RecordError(
            f"{url} names {match['name']}, not {name}: refusing a checksum of another file"
        )
    return sha256


@dataclass(frozen=True)
class Release:
    """One driver release in NVIDIA's releases.json."""

    branch: str
    branch_type: str  # "lts branch", "production branch", "new feature branch"
    version: str
    date: str
    notes: str  # the release notes' URL on docs.nvidia.com, or ""


def newest_releases(feed: object, url: str) -> dict[str, Release]:
    """Each branch's newest release (by version) in releases.json; malformed rows are skipped,
    a file that is not the list at all is refused."""
    if not isinstance(feed, Mapping) or not feed:
        raise RecordError(f"{url} is not NVIDIA's list of releases (no branches)")
    newest: dict[str, Release] = {}
    for branch, entry in feed.items():
        infos = entry.get("driver_info") if isinstance(entry, Mapping) else None
        if not isinstance(branch, str) or not isinstance(infos, list):
            continue
        branch_type = shown(str(entry.get("type", "")))
        for info in infos:
            version = info.get("release_version") if isinstance(info, Mapping) else None
            if not isinstance(version, str) or not DRIVER_VERSION_RE.fullmatch(version):
                continue
            if version.split(".", 1)[0] != branch:
                continue
            if branch in newest and driver_key(version) <= driver_key(newest[branch].version):
                continue
            notes = shown(str(info.get("release_notes", "")))
            newest[branch] = Release(
                branch,
                branch_type,
                version,
                shown(str(info.get("release_date", ""))),
                notes if notes.startswith("https://docs.nvidia.com/") else "",
            )
    if not newest:
        raise RecordError(f"{url} lists no driver release: not NVIDIA's list of releases")
    return newest
