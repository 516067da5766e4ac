"""What one ``invoke build`` / ``push`` / ``tags`` is about, resolved from its options.

Defaults: the newest driver in versions.toml, the current stable Flatcar release from the
releases feed, this machine's architecture. Build-image aliases go to the releases ``invoke
matrix`` covers for the driver, or only to the release named with --flatcar-version.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gdc import matrix, releases
from gdc.tags import DEFAULT_IMAGE, Variant
from gdc.versions import ARCHES, Driver, Versions, VersionsError, driver_branch
from nvidia_driver.flatcar import Release

_MACHINE_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
ALL_ARCHES = "all"


@dataclass(frozen=True)
class Sources:
    """Where the image builds download from; "" keeps the Dockerfiles' defaults (NVIDIA's)."""

    base_image: str = ""
    driver_base_url: str = ""
    fabricmanager_base_url: str = ""
    release_base_url: str = ""  # FLATCAR_RELEASE_BASE_URL, a template with {channel}
    keyring: Path | None = None  # FLATCAR_KEYRING for a mirror's (or a test's) signatures


@dataclass(frozen=True)
class Request:
    variant: Variant
    driver: Driver
    flatcar: Release  # the release a precompiled image is for; the build image's label
    aliases: tuple[str, ...]  # Flatcar versions the build image gets an alias tag for
    arches: tuple[str, ...]
    registry: str = ""
    image: str = DEFAULT_IMAGE
    prefix: str = ""
    driver_sha256: str = ""  # overrides versions.toml: HEX or amd64=HEX,arm64=HEX
    sources: Sources = field(default_factory=Sources)
    git_commit: str = "unknown"
    source_url: str = "unknown"
    network: str = "host"

    @property
    def multi_arch(self) -> bool:
        return len(self.arches) > 1

    def sha256_spec(self) -> str:
        """The DRIVER_SHA256 build argument: ``arch=HEX`` for each architecture built.

        Always in this one form, however the checksum was given: the same inputs must give
        the same build arguments, or Docker's layer cache is missed.
        """
        given = self.driver_sha256
        if not given:
            sums = {arch: self.driver.checksum(arch) for arch in self.arches}
        elif "=" not in given:
            sums = dict.fromkeys(self.arches, given)
        else:
            pairs = dict(pair.split("=", 1) for pair in given.split(",") if "=" in pair)
            sums = {arch: pairs.get(arch, "") for arch in self.arches}
        return ",".join(f"{arch}={checksum}" for arch, checksum in sums.items())


@dataclass(frozen=True)
class Options:
    """The task's options, as typed on the command line ("" means the default)."""

    variant: str = Variant.PRECOMPILED.value
    driver_version: str = ""
    flatcar_version: str = ""
    arch: str = ""
    registry: str = ""
    image: str = DEFAULT_IMAGE
    prefix: str = ""
    releases_url: str = ""
    driver_sha256: str = ""
    network: str = "host"
    sources: Sources = field(default_factory=Sources)


def host_arch() -> str:
    machine = platform.machine()
    try:
        return _MACHINE_ARCH[machine]
    except KeyError:
        raise VersionsError(f"no image architecture for this machine ({machine})") from None


def parse_arches(text: str, versions: Versions) -> tuple[str, ...]:
    """ "" -> this machine's; "all" -> versions.toml's; else a comma-separated list."""
    if not text:
        return (host_arch(),)
    if text == ALL_ARCHES:
        return versions.arches
    arches = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [arch for arch in arches if arch not in ARCHES]
    if unknown or not arches:
        raise VersionsError(f"unknown architecture {text!r}: use amd64, arm64, a list or 'all'")
    return arches


def parse_variant(text: str) -> Variant:
    try:
        return Variant(text)
    except ValueError:
        raise VersionsError(f"unknown variant {text!r}: use build or precompiled") from None


def _driver(options: Options, versions: Versions) -> Driver:
    """The listed driver, or an unlisted full version (hotfixes, tests).

    An unlisted driver has no recorded checksum, so building it needs --driver-sha256; its
    tags and pushes need none.
    """
    if not options.driver_version:
        return versions.newest
    try:
        return versions.driver(options.driver_version)
    except VersionsError:
        if "." not in options.driver_version:  # a branch must be one versions.toml lists
            raise
        driver_branch(options.driver_version)  # validates
        return Driver(options.driver_version, {})


def resolve(
    options: Options,
    versions: Versions,
    env: Mapping[str, str],
    *,
    reader: releases.FeedReader = releases.read_url,
    git_commit: str = "unknown",
    source_url: str = "unknown",
) -> Request:
    variant = parse_variant(options.variant)
    driver = _driver(options, versions)
    feed = releases.load_feed(releases.feed_url(env, options.releases_url), reader)
    if options.flatcar_version:
        flatcar = releases.find_release(feed, options.flatcar_version)
        aliases: tuple[str, ...] = (str(flatcar.version),)
    else:
        flatcar = releases.current_stable(feed)
        aliases = matrix.aliases_for(feed, versions, driver)
    return Request(
        variant=variant,
        driver=driver,
        flatcar=flatcar,
        aliases=aliases,
        arches=parse_arches(options.arch, versions),
        registry=options.registry,
        image=options.image,
        prefix=options.prefix,
        driver_sha256=options.driver_sha256,
        sources=options.sources,
        git_commit=git_commit,
        source_url=source_url,
        network=options.network,
    )
