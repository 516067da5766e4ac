"""What one ``invoke build`` / ``push`` / ``tags`` is about, resolved from its options.

Defaults: the newest driver in versions.toml, the current stable Flatcar release from the
releases feed, this machine's architecture. Build-image aliases go to the releases ``invoke
matrix`` covers for the driver, or only to the release named with --flatcar-version.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from gdc import coverage, matrix, releases
from gdc.tags import DEFAULT_IMAGE, Variant, check_repository
from gdc.versions import Driver, Versions, VersionsError, driver_branch
from nvidia_driver.digests import ANY, digest_list
from nvidia_driver.errors import DriverError
from nvidia_driver.naming import ARCH_OF, ARCHES, FLATCAR_VERSION_RE
from nvidia_driver.sources import redist
from nvidia_driver.sources.flatcar import Release

ALL_ARCHES = "all"


@dataclass(frozen=True)
class Upstream:
    """Where the image builds download from; "" keeps the Dockerfiles' defaults (NVIDIA's)."""

    base_image: str = ""
    driver_base_url: str = ""
    fabricmanager_base_url: str = ""
    release_base_url: str = ""  # FLATCAR_RELEASE_BASE_URL, a template with {channel}
    keyring: Path | None = None  # FLATCAR_KEYRING for a mirror's (or a test's) signatures


@dataclass(frozen=True)
class BuildSettings:
    """What every build of a run shares: where its tags go, where it downloads from, and its
    provenance (the commit, its repository's URL and time: the images' labels)."""

    registry: str = ""
    image: str = DEFAULT_IMAGE
    prefix: str = ""
    upstream: Upstream = field(default_factory=Upstream)
    network: str = "host"
    git_commit: str = "unknown"
    source_url: str = "unknown"
    created: str = ""  # org.opencontainers.image.created: the commit's time (RFC 3339)


@dataclass(frozen=True)
class Request:
    variant: Variant
    driver: Driver
    flatcar: Release  # the release a precompiled image is for; the build image's label
    aliases: tuple[str, ...]  # Flatcar versions the build image gets an alias tag for
    arches: tuple[str, ...]
    # Precompiled: the releases it carries packages for (flatcar's first; all of one kernel),
    # and those its <branch>-<kernel>-flatcar<A> tags name (gdc.matrix explains which and why).
    releases: tuple[str, ...] = ()
    os_versions: tuple[str, ...] = ()
    settings: BuildSettings = field(default_factory=BuildSettings)
    driver_sha256: str = ""  # overrides versions.toml: HEX or amd64=HEX,arm64=HEX
    redist_sha256: str = ""  # overrides versions.toml: component.arch=HEX,...

    @property
    def carried(self) -> tuple[str, ...]:
        return self.releases or (str(self.flatcar.version),)

    @property
    def multi_arch(self) -> bool:
        return len(self.arches) > 1

    @cached_property
    def sha256_spec(self) -> str:
        """The DRIVER_SHA256 build argument: ``arch=HEX`` for each architecture built.

        Always in this one form, however the checksum was given: the same inputs must give
        the same build arguments, or Docker's layer cache is missed. Worked out once per
        request, as the build arguments and the recorded inputs both take it.
        """
        given = driver_digests(self.driver_sha256)
        if not given:
            try:
                sums = {arch: self.driver.checksum(arch) for arch in self.arches}
            except VersionsError as exc:
                raise VersionsError(f"{exc}, or pass --driver-sha256") from None
        elif ANY in given:
            sums = dict.fromkeys(self.arches, given[ANY])
        else:
            missing = [arch for arch in self.arches if arch not in given]
            if missing:
                raise VersionsError(
                    f"--driver-sha256 {self.driver_sha256!r} gives no checksum for "
                    f"{', '.join(missing)}, which this build is for: add {missing[0]}=<sha256>"
                )
            sums = {arch: given[arch] for arch in self.arches}
        return ",".join(f"{arch}={checksum}" for arch, checksum in sums.items())

    @cached_property
    def redist_spec(self) -> str:
        """The REDIST_SHA256 build argument: ``component.arch=HEX`` for the arches built.

        versions.toml's record, with --redist-sha256 given over it. The fabric manager and
        NSCQ must be recorded or given: without them the image is refused here, before any
        build. An optional archive recorded as "TODO" (NVLSM, IMEX, NVSDM, whose digests no
        public source lists yet) is left out: the image is built without it, as
        :meth:`unrecorded_redist` says, and never with an archive nobody recorded. Worked
        out once per request.
        """
        given = self.given_redist
        sums: dict[str, str] = {}
        for arch in self.arches:
            recorded = self.driver.redist_checksums(arch)
            for component in redist.REQUIRED_KEYS:
                key = f"{component}.{arch}"
                if key not in given and recorded.get(key) is None:
                    raise VersionsError(
                        f"no SHA-256 recorded for the {component} archive of driver "
                        f"{self.driver.version} on {arch}: `invoke record-driver "
                        f"{self.driver.version}` writes it from NVIDIA's redistrib_"
                        f"{self.driver.version}.json into versions.toml [drivers."
                        f'"{self.driver.version}".redist], or pass --redist-sha256 '
                        f"{component}.{arch}=<sha256>"
                    )
            sums.update({key: value for key, value in recorded.items() if value is not None})
        sums.update({key: value for key, value in given.items() if key.endswith(self.arches)})
        return ",".join(f"{key}={checksum}" for key, checksum in sorted(sums.items()))

    def unrecorded_redist(self) -> list[str]:
        """``component.arch`` of each optional archive the image is built without (TODO)."""
        given = self.given_redist
        return sorted(
            key
            for arch in self.arches
            for key, recorded in self.driver.redist_checksums(arch).items()
            if recorded is None and key not in given
        )

    @cached_property
    def given_redist(self) -> dict[str, str]:
        """--redist-sha256, read: ``component.arch`` -> HEX."""
        try:
            return digest_list(self.redist_sha256, "--redist-sha256")
        except DriverError as exc:
            raise VersionsError(str(exc)) from None


@dataclass(frozen=True)
class Options:
    """The task's options, as typed on the command line ("" means the default)."""

    variant: str = Variant.PRECOMPILED.value
    driver_version: str = ""
    flatcar_version: str = ""
    arch: str = ""
    settings: BuildSettings = field(default_factory=BuildSettings)
    releases_url: str = ""
    driver_sha256: str = ""
    redist_sha256: str = ""


def host_arch() -> str:
    machine = platform.machine()
    try:
        return ARCH_OF[machine]
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


def driver_digests(text: str) -> dict[str, str]:
    """--driver-sha256: 64 hex digits ({ANY: HEX}), or arch=HEX pairs for known arches."""
    invalid = VersionsError(
        f"invalid --driver-sha256 {text!r}: give 64 hex digits, or amd64=<64 hex>,arm64=<64 hex>"
    )
    try:
        digests = digest_list(text, "--driver-sha256")
    except DriverError:
        raise invalid from None
    if not set(digests) <= {ANY, *ARCHES}:
        raise invalid
    return digests


def check_options(options: Options, *, push: bool = False) -> None:
    """Everything about the options that needs no network and no Docker, checked first."""
    parse_variant(options.variant)
    check_repository(options.settings.registry, options.settings.image)
    driver_digests(options.driver_sha256)
    if push and not options.settings.registry:
        raise VersionsError(
            "--push needs --registry (e.g. ghcr.io/<your owner>): without one docker would "
            "push to Docker Hub's library/"
        )
    if options.flatcar_version and not FLATCAR_VERSION_RE.fullmatch(options.flatcar_version):
        raise VersionsError(f"invalid --flatcar-version {options.flatcar_version!r}: expected "
                            "MAJOR.MINOR.PATCH such as 4593.2.5")  # fmt: skip


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


def _covered(feed: str, versions: Versions, lts_info: coverage.LtsInfo | None) -> (
    tuple[coverage.Covered, ...]
):  # fmt: skip
    try:
        return coverage.covered_releases(feed, versions, lts_info)[0]
    except releases.ReleaseError:
        return ()  # a named release builds without the matrix


def resolve(
    options: Options,
    versions: Versions,
    env: Mapping[str, str],
    *,
    reader: releases.FeedReader = releases.read_text,
) -> Request:
    """The request options name; without --flatcar-version, the current stable release's
    precompiled image with every covered release of its kernel, as invoke publish builds it."""
    check_options(options)
    variant = parse_variant(options.variant)
    driver = _driver(options, versions)
    arches = parse_arches(options.arch, versions)
    feed = releases.load_feed(releases.feed_url(env, options.releases_url), reader)
    if options.flatcar_version:
        flatcar = releases.find_release(feed, options.flatcar_version)
        aliases: tuple[str, ...] = (str(flatcar.version),)
        carried, os_versions = aliases, aliases
    else:
        flatcar = releases.current_stable(feed)
        lts = releases.lts_info(env, reader) if "lts" in versions.channels else None
        covered = [c for c in _covered(feed, versions, lts)
                   if not matrix.build_problem(driver, c.release.kernel_release)]  # fmt: skip
        aliases = tuple(c.version for c in covered)
        same_kernel = [c.version for c in covered
                       if c.release.kernel_release == flatcar.kernel_release]  # fmt: skip
        carried = tuple(dict.fromkeys([str(flatcar.version), *same_kernel]))
        os_versions = tuple(dict.fromkeys([*coverage.os_versions(covered), *carried]))
    return Request(variant, driver, flatcar, aliases, arches, carried, os_versions,
                   options.settings, options.driver_sha256, options.redist_sha256)  # fmt: skip
