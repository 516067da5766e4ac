"""What to publish: the live Flatcar releases, crossed with the drivers and the arches.

The releases covered are the current release of each channel that versions.toml lists (``lts``:
every supported LTS stream, from Flatcar's lts-info) plus the releases pinned there
(:mod:`gdc.coverage`). Images, one platform per arch:

* per driver, a **build image** ``<driver>-flatcar``, with an alias ``<driver>-flatcar-flatcar<V>``
  for each covered release V it can serve;
* per driver and **kernel**, a **precompiled image** carrying the packages of every covered
  release with that kernel: several live releases often share one (6.12.102 was stable
  4593.2.5, beta 4757.1.0 and alpha 4790.0.0 at once) but their banners differ, and the GPU
  Operator sends all nodes of one kernel to one image. It is tagged ``<driver>-flatcar<V>`` for
  each of those releases and ``<branch>-<kernel>-flatcar<A>`` for **every** covered release A
  and every release a stream's current one superseded (:func:`gdc.coverage.previous`): with
  ``usePrecompiled`` the Operator gives each per-kernel DaemonSet the OS tag of the first GPU
  node it lists (gpu-operator ``controllers/object_controls.go`` ``resolveDriverTag``,
  ``state_manager.go`` ``getGPUNodeOSInfo``), so a node on release B asks for
  ``<branch>-<kernel B>-flatcar<A>``, and during a rolling update that first node may still run
  the release B superseded. Serving it B's image is safe: the image checks the node's banner
  and builds at runtime when nothing matches.

Excluded, with the reason: streams without a usable current release, releases not built for an
arch, arm64 releases whose module build tree carries x86-64 host tools (before 4230.1.0, LTS
4081: :data:`NATIVE_ARM64_TOOLS`), and driver/kernel pairs known not to build, i.e. a driver
branch that a kernel change broke and for which the entrypoint ships no compatibility patch
(:func:`nvidia_driver.kbuild.compat.build_problem`, which the reboot gate shares).

``invoke matrix --json`` prints one line (``invoke matrix --github-output`` writes it to
``$GITHUB_OUTPUT`` as ``json=``)::

    {"include": [{"id": "build-610.57.04-amd64", "variant": "build", "driver": "610.57.04",
                  "branch": "610", "arch": "amd64", "flatcar": [], "streams": [],
                  "kernel": "", "aliases": ["4081.3.10", "4593.2.5", ...],
                  "repository": "ghcr.io/me/driver", "tags": ["610.57.04-flatcar", ...]},
                 {"id": "precompiled-610.57.04-6.12.102-flatcar-amd64",
                  "variant": "precompiled", "driver": "610.57.04", "branch": "610",
                  "arch": "amd64", "flatcar": ["4593.2.5", "4757.1.0", "4790.0.0"],
                  "streams": ["stable", "beta", "alpha"], "kernel": "6.12.102-flatcar",
                  "aliases": [], "repository": "ghcr.io/me/driver",
                  "tags": ["610.57.04-flatcar4593.2.5", ...,
                           "610-6.12.102-flatcar-flatcar4081.3.10", ...]}],
     "excluded": [{"variant": "*", "driver": "*", "flatcar": "4790.0.1", "arch": "*",
                   "reason": "..."}],
     "notes": ["..."],
     "releases": [{"flatcar": "4593.2.5", "channel": "stable", "streams": ["stable"],
                   "kernel": "6.12.102-flatcar"}],
     "drivers": ["580.178.04", "595.91.07", "610.57.04"],
     "arches": [{"arch": "amd64", "runner": "ubuntu-24.04", "group": "..."}, ...],
     "group": "publish ghcr.io/me/driver"}

``arches`` is what a workflow fans out over, one job per arch on a native runner
(:data:`RUNNERS`), and ``group`` the concurrency group of the job that merges the arches'
images under the final tags (each arch job's ``group`` covers the tags that job pushes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gdc import releases
from gdc.coverage import ALL, PINNED, Covered, Exclusion, LtsInfo, covered_releases, os_versions
from gdc.tags import (
    DEFAULT_IMAGE,
    ImageTags,
    Variant,
    build_image_tags,
    precompiled_tags,
    staging_tag,
)
from gdc.tags import repository as join_repository
from gdc.text import format_table
from gdc.versions import Driver, Versions
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild import compat
from nvidia_driver.sources.flatcar import FlatcarVersion

__all__ = ["ALL", "PINNED", "Covered", "Exclusion", "Image", "Matrix", "Platform"]

# GitHub's hosted runners by arch: each arch builds natively (arm64: GitHub's arm64 runners,
# labels ubuntu-24.04-arm / ubuntu-22.04-arm).
RUNNERS = {"amd64": "ubuntu-24.04", "arm64": "ubuntu-24.04-arm"}
# The first release per channel whose arm64 module build tree has native host tools (fixdep,
# modpost): flatcar/scripts#2694, changelog 2025-03-07-coreos-modules-cross-compilation.md, in
# the scripts tags beta-4230.1.0, stable-4230.2.0 and alpha-4277.0.0 (not alpha-4230.0.1, not
# lts-4081.3.x); LTS 4230 branched from stable 4230.
NATIVE_ARM64_TOOLS = {
    "alpha": FlatcarVersion(4277, 0, 0),
    "beta": FlatcarVersion(4230, 1, 0),
    "stable": FlatcarVersion(4230, 2, 0),
    "lts": FlatcarVersion(4230, 3, 0),
}


@dataclass(frozen=True)
class Platform:
    """One arch of one image; a precompiled one carries the packages of its releases."""

    arch: str
    releases: tuple[Covered, ...] = ()


@dataclass(frozen=True)
class Image:
    """One image: one tag set, one platform per arch."""

    variant: Variant
    driver: Driver
    tags: ImageTags
    platforms: tuple[Platform, ...]
    kernel: str = ""  # precompiled: the kernel release (uname -r) its packages are for
    aliases: tuple[str, ...] = ()  # build: the Flatcar versions of its alias tags
    prefix: str = ""

    @property
    def arches(self) -> tuple[str, ...]:
        return tuple(platform.arch for platform in self.platforms)

    @property
    def releases(self) -> tuple[Covered, ...]:
        """Every release whose packages it carries, on any arch, oldest first."""
        seen = {c.version: c for p in self.platforms for c in p.releases}
        return tuple(sorted(seen.values(), key=lambda c: c.release.version))

    def platform(self, arch: str) -> Platform:
        return next(platform for platform in self.platforms if platform.arch == arch)

    def staging_tag(self, arch: str) -> str:
        """The tag one arch's image is pushed under before the arches are merged."""
        return staging_tag(self.driver.version, self.kernel, arch, self.prefix)

    @property
    def id(self) -> str:
        kernel = f"-{self.kernel}" if self.kernel else ""
        return f"{self.variant}-{self.driver.version}{kernel}"

    @property
    def label(self) -> str:
        if self.variant is Variant.BUILD:
            return f"build {self.driver.version}"
        versions = ", ".join(c.version for c in self.releases)
        return f"precompiled {self.driver.version} for Flatcar {versions}"


@dataclass(frozen=True)
class Matrix:
    releases: tuple[Covered, ...]
    images: tuple[Image, ...]  # build images first
    excluded: tuple[Exclusion, ...]
    notes: tuple[str, ...] = ()
    repository: str = DEFAULT_IMAGE
    prefix: str = ""
    arches: tuple[str, ...] = ()

    def build_image(self, driver: Driver) -> Image:
        builds = (i for i in self.images if i.variant is Variant.BUILD)
        return next(i for i in builds if i.driver.version == driver.version)


# --- drivers -----------------------------------------------------------------------------------


def build_problem(driver: Driver, kernel_release: str) -> str:
    """Why driver's modules do not build for the kernel, or "" when they should."""
    try:
        return compat.build_problem(driver.version, kernel_release)
    except DriverError as exc:
        raise releases.ReleaseError(str(exc)) from None


def arch_problem(release: Covered, arch: str) -> str:
    """Why release gets no precompiled image on arch, or ""."""
    if arch not in release.release.arches:
        return f"Flatcar {release.version} is not released for {arch}"
    version = release.release.version
    first = NATIVE_ARM64_TOOLS.get(release.release.channel)
    if arch == "arm64" and (first is None or version < first):
        return (
            f"Flatcar {release.version}'s arm64 module build tree carries x86-64 host tools "
            "(fixdep, modpost; native from 4230.1.0): its modules cannot be built, so arm64 "
            "nodes on it need a newer release; the build image refuses such a node too"
        )
    return ""


# --- the matrix --------------------------------------------------------------------------------


def _by_kernel(servable: Iterable[Covered]) -> dict[str, list[Covered]]:
    kernels: dict[str, list[Covered]] = {}
    for release in servable:
        kernels.setdefault(release.release.kernel_release, []).append(release)
    return kernels


def precompiled_image(  # noqa: PLR0917 - one image's facts
    driver: Driver, kernel: str, releases_of_kernel: Iterable[Covered],
                      os_versions: Iterable[str], arches: Iterable[str], repository: str,
                      prefix: str = "") -> tuple[Image | None, list[Exclusion]]:  # fmt: skip
    """The image of driver for kernel, and the (release, arch) pairs it leaves out."""
    platforms, excluded = [], []
    for arch in arches:
        carried = []
        for release in releases_of_kernel:
            problem = arch_problem(release, arch)
            if problem:
                excluded.append(Exclusion(Variant.PRECOMPILED.value, driver.version,
                                          release.version, arch, problem))  # fmt: skip
            else:
                carried.append(release)
        if carried:
            platforms.append(Platform(arch, tuple(carried)))
    if not platforms:
        return None, excluded
    versions = list(dict.fromkeys(c.version for p in platforms for c in p.releases))
    tags = precompiled_tags(driver.version, versions, kernel, os_versions, prefix)
    image = Image(Variant.PRECOMPILED, driver, ImageTags(repository, tags), tuple(platforms),
                  kernel=kernel, prefix=prefix)  # fmt: skip
    return image, excluded


def build_matrix(
    feed_text: str,
    versions: Versions,
    *,
    lts_info: LtsInfo | None = None,
    registry: str = "",
    image: str = DEFAULT_IMAGE,
    prefix: str = "",
) -> Matrix:
    covered, excluded_releases, notes = covered_releases(feed_text, versions, lts_info)
    repository = join_repository(registry, image)
    tagged = os_versions(covered)
    builds: list[Image] = []
    precompiled: list[Image] = []
    excluded = list(excluded_releases)
    for driver in versions.drivers:
        servable: list[Covered] = []
        for release in covered:
            problem = build_problem(driver, release.release.kernel_release)
            if problem:
                excluded.append(Exclusion(ALL, driver.version, release.version, ALL, problem))
            else:
                servable.append(release)
        aliases = tuple(release.version for release in servable)
        tags = ImageTags(repository, build_image_tags(driver.version, aliases, prefix))
        builds.append(Image(Variant.BUILD, driver, tags,
                            tuple(Platform(arch) for arch in versions.arches), aliases=aliases,
                            prefix=prefix))  # fmt: skip
        for kernel, of_kernel in _by_kernel(servable).items():
            made, left_out = precompiled_image(driver, kernel, of_kernel, tagged,
                                               versions.arches, repository, prefix)  # fmt: skip
            excluded += left_out
            if made is not None:
                precompiled.append(made)
    return Matrix(covered, (*builds, *precompiled), tuple(excluded), notes, repository, prefix,
                  versions.arches)  # fmt: skip


# --- output ------------------------------------------------------------------------------------


def _entry_json(image: Image, platform: Platform) -> dict[str, Any]:
    streams = list(dict.fromkeys(s for c in platform.releases for s in c.streams))
    return {
        "id": f"{image.id}-{platform.arch}",
        "variant": image.variant.value,
        "driver": image.driver.version,
        "branch": image.driver.branch,
        "arch": platform.arch,
        "flatcar": [c.version for c in platform.releases],
        "streams": streams,
        "kernel": image.kernel,
        "aliases": list(image.aliases),
        "repository": image.tags.repository,
        "tags": list(image.tags.tags),
    }


def publish_group(matrix: Matrix, arch: str = "") -> str:
    """The concurrency group of a job that pushes the matrix's tags (one arch's, or the merge)."""
    tags = f"{matrix.repository}:{matrix.prefix or '<release tags>'}"
    return f"publish {tags}{f' {arch}' if arch else ''}"


def to_json(matrix: Matrix) -> str:
    """One line of JSON (see the module docstring for its shape)."""
    document = {
        "include": [_entry_json(i, p) for i in matrix.images for p in i.platforms],
        # The drivers with a build image, oldest first: a job per driver fans out over these.
        "drivers": [i.driver.version for i in matrix.images if i.variant is Variant.BUILD],
        "arches": [{"arch": arch, "runner": RUNNERS[arch], "group": publish_group(matrix, arch)}
                   for arch in matrix.arches],
        "group": publish_group(matrix),
        "excluded": [vars(exclusion) for exclusion in matrix.excluded],
        "notes": list(matrix.notes),
        "releases": [
            {"flatcar": c.version, "channel": c.release.channel, "streams": list(c.streams),
             "kernel": c.release.kernel_release}
            for c in matrix.releases
        ],
    }  # fmt: skip
    return json.dumps(document, separators=(",", ":"))


def _tags_cell(image: Image) -> str:
    extra = len(image.tags.tags) - 1
    return f"{image.tags.tags[0]} (+{extra} tag{'s' if extra != 1 else ''})"


def to_table(matrix: Matrix) -> str:
    lines = [f"Flatcar releases ({len(matrix.releases)}):\n"]
    lines.append(format_table(
        ("FLATCAR", "STREAMS", "KERNEL", "ARCHES"),
        [(c.version, ",".join(c.streams), c.release.kernel_release, ",".join(c.release.arches))
         for c in matrix.releases],
    ))  # fmt: skip
    lines.append(f"\nImages ({len(matrix.images)}):\n")
    lines.append(format_table(
        ("VARIANT", "DRIVER", "FLATCAR", "KERNEL", "ARCHES", "TAGS"),
        [(i.variant.value, i.driver.version, ",".join(c.version for c in i.releases) or "-",
          i.kernel or "-", ",".join(i.arches), _tags_cell(i)) for i in matrix.images],
    ))  # fmt: skip
    if matrix.excluded:
        lines.append(f"\nExcluded ({len(matrix.excluded)}):\n")
        lines.append(format_table(
            ("VARIANT", "DRIVER", "FLATCAR", "ARCH", "REASON"),
            [(x.variant, x.driver, x.flatcar, x.arch, x.reason) for x in matrix.excluded],
        ))  # fmt: skip
    if matrix.notes:
        lines.append(f"\nNotes ({len(matrix.notes)}):\n")
        lines += [f"- {note}\n" for note in matrix.notes]
    return "".join(lines)
