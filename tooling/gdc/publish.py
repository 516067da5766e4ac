"""``invoke publish``: build and push what the registry lacks, for every image of the matrix.

An image is the matrix entries of one variant, driver and release: one tag set, one platform
per arch. For each, the registry is asked about every tag (:mod:`gdc.registry`):

* every tag there, pointing at one image with every arch: **skipped**;
* the first tag there with every arch, other tags missing or pointing elsewhere: **tagged**,
  those tags get the first tag's manifest by a manifest PUT (no build, no blob moves); this is
  how the build image gets its alias for a new Flatcar release;
* otherwise **built** with every tag and arch (``invoke build``'s code: buildx for several
  arches) and pushed, then looked up again to confirm.

Build images go first; a precompiled image is built on its driver's build image in the
registry and fails, saying so, when that one failed. Each image is otherwise independent: a
failure is recorded and the run goes on. Nothing is remembered between runs (the registry is
asked again each time), so a re-run after a failure or an interruption completes the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from gdc import images
from gdc.docker_api import Docker, DockerError, Progress
from gdc.matrix import Covered, Exclusion, Matrix
from gdc.plan import Request, Sources
from gdc.registry import Manifest, Registry, RegistryError, Repository
from gdc.releases import ReleaseError
from gdc.table import format_table
from gdc.tags import DEFAULT_IMAGE, ImageTags, TagError, Variant
from gdc.versions import Driver, VersionsError
from nvidia_driver.errors import DriverError

FAILURES = (DockerError, RegistryError, VersionsError, TagError, ReleaseError, DriverError, OSError)


class Action(StrEnum):
    BUILD = "build"
    TAG = "tag"
    SKIP = "skip"
    FAIL = "fail"


class Status(StrEnum):
    BUILT = "built"
    TAGGED = "tagged"
    SKIPPED = "skipped"
    FAILED = "failed"
    EXCLUDED = "excluded"


_DONE = {Action.BUILD: Status.BUILT, Action.TAG: Status.TAGGED, Action.SKIP: Status.SKIPPED,
         Action.FAIL: Status.FAILED}  # fmt: skip


@dataclass(frozen=True)
class Image:
    """The matrix entries that share one tag set: one image, one platform per arch."""

    variant: Variant
    driver: Driver
    arches: tuple[str, ...]
    tags: ImageTags
    release: Covered | None = None
    aliases: tuple[str, ...] = ()

    @property
    def platforms(self) -> frozenset[str]:
        return frozenset(f"linux/{arch}" for arch in self.arches)


def images_of(matrix: Matrix) -> tuple[Image, ...]:
    """The matrix's images, build images first, each with the arches of its entries."""
    grouped: dict[tuple[str, ...], Image] = {}
    for entry in matrix.entries:
        key = (entry.variant, entry.driver.version, entry.tags.primary)
        known = grouped.get(key)
        arches = (*known.arches, entry.arch) if known else (entry.arch,)
        grouped[key] = Image(entry.variant, entry.driver, arches, entry.tags, entry.release,
                             entry.aliases)  # fmt: skip
    ordered = sorted(grouped.values(), key=lambda image: image.variant is not Variant.BUILD)
    return tuple(ordered)


@dataclass(frozen=True)
class Step:
    """What to do for one image, and why."""

    image: Image
    action: Action
    reason: str
    tags: tuple[str, ...] = ()  # to copy the source manifest to (TAG)
    source: str = ""  # the digest the first tag points at


def _one_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def plan_image(image: Image, registry: Registry, repository: Repository) -> Step:
    """Ask the registry about every tag of image and decide (the module docstring's rules)."""
    name, first = repository.name, image.tags.tags[0]
    try:
        digests = {tag: registry.digest(name, tag) for tag in image.tags.tags}
        source = digests[first]
        lacking = image.platforms - registry.platforms(name, first) if source else set()
    except RegistryError as exc:
        return Step(image, Action.FAIL, str(exc))
    if source is None or lacking:
        why = f"lacks {', '.join(sorted(lacking))}" if lacking else "not in the registry"
        try:
            for arch in image.arches:
                image.driver.checksum(arch)
        except VersionsError as exc:
            return Step(image, Action.FAIL, f"{first} {why}, and cannot be built: {exc}")
        return Step(image, Action.BUILD, f"{first} {why}", image.tags.tags)
    stale = tuple(tag for tag, digest in digests.items() if digest != source)
    if stale:
        missing = [tag for tag in stale if digests[tag] is None]
        why = "missing" if len(missing) == len(stale) else "missing or pointing elsewhere"
        return Step(image, Action.TAG, f"{len(stale)} tag(s) {why}", stale, source)
    return Step(image, Action.SKIP, f"all {len(digests)} tag(s) exist", source=source)


class Builder(Protocol):
    def __call__(self, image: Image, build_image: str) -> None:
        """Build image (a precompiled one on build_image, in the registry) and push every tag."""
        ...


@dataclass(frozen=True)
class BuildSettings:
    """What every build of a publish run shares (``invoke build``'s options)."""

    registry: str
    image: str = DEFAULT_IMAGE
    prefix: str = ""
    sources: Sources = field(default_factory=Sources)
    network: str = "host"
    git_commit: str = "unknown"
    source_url: str = "unknown"


@dataclass(frozen=True)
class DockerBuilder:
    """Builds and pushes with ``invoke build``'s code (:mod:`gdc.images`)."""

    settings: BuildSettings
    releases: tuple[Covered, ...]  # the matrix's; a build image's request names the first
    connect: Callable[[bool], Docker]  # multi-arch? -> the Docker adapter
    progress: Progress

    def request(self, image: Image) -> Request:
        release = image.release or self.releases[0]
        return Request(
            variant=image.variant,
            driver=image.driver,
            flatcar=release.release,
            aliases=image.aliases,
            arches=image.arches,
            registry=self.settings.registry,
            image=self.settings.image,
            prefix=self.settings.prefix,
            sources=self.settings.sources,
            git_commit=self.settings.git_commit,
            source_url=self.settings.source_url,
            network=self.settings.network,
        )

    def __call__(self, image: Image, build_image: str) -> None:
        request = self.request(image)
        docker = self.connect(request.multi_arch)
        built = images.build_images(request, docker, self.progress, build_image=build_image)
        images.push_images(built, docker, self.progress)


@dataclass(frozen=True)
class Outcome:
    image: Image
    status: Status
    detail: str
    digest: str = ""
    planned: bool = False  # a dry run's step: nothing was done


def _execute(step: Step, registry: Registry, repository: Repository, builder: Builder,
             build_image: str) -> Outcome:  # fmt: skip
    image, name = step.image, repository.name
    if step.action in {Action.SKIP, Action.FAIL}:
        return Outcome(image, _DONE[step.action], step.reason, step.source)
    try:
        if step.action is Action.TAG:
            manifest: Manifest = registry.manifest(name, step.source)
            for tag in step.tags:
                registry.put_manifest(name, tag, manifest)
            return Outcome(image, Status.TAGGED, f"added {', '.join(step.tags)}", step.source)
        builder(image, build_image)
        pushed = {tag: registry.digest(name, tag) for tag in image.tags.tags}
    except FAILURES as exc:
        return Outcome(image, Status.FAILED, f"{step.reason}; {step.action} failed: "
                                             f"{_one_line(exc)}")  # fmt: skip
    absent = [tag for tag, digest in pushed.items() if digest is None]
    if absent:
        return Outcome(image, Status.FAILED,
                       f"built, but the registry has no {', '.join(absent)}")  # fmt: skip
    return Outcome(image, Status.BUILT, step.reason, pushed[image.tags.tags[0]] or "")


def publish(
    matrix: Matrix,
    registry: Registry,
    repository: Repository,
    builder: Builder,
    *,
    dry_run: bool = False,
    say: Callable[[str], None] = print,
) -> list[Outcome]:
    """Plan and (unless dry_run) carry out every image of matrix; one outcome per image."""
    outcomes: list[Outcome] = []
    failed_builds: dict[str, str] = {}  # driver version -> its build image's reference
    for image in images_of(matrix):
        step = plan_image(image, registry, repository)
        build_image = f"{repository}:{_build_tag(matrix, image.driver)}"
        if step.action is Action.BUILD and image.driver.version in failed_builds:
            step = Step(image, Action.FAIL, f"{step.reason}, and its build image "
                                            f"{build_image} failed")  # fmt: skip
        say(f"{step.action}: {repository}:{image.tags.tags[0]} ({step.reason})")
        if dry_run:
            outcomes.append(
                Outcome(image, _DONE[step.action], step.reason, step.source, planned=True)
            )
            continue
        outcome = _execute(step, registry, repository, builder, build_image)
        if image.variant is Variant.BUILD and outcome.status is Status.FAILED:
            failed_builds[image.driver.version] = build_image
        outcomes.append(outcome)
    return outcomes


def _build_tag(matrix: Matrix, driver: Driver) -> str:
    return next(
        entry.tags.tags[0]
        for entry in matrix.entries
        if entry.variant is Variant.BUILD and entry.driver.version == driver.version
    )


# --- the summary -------------------------------------------------------------------------------


def _label(image: Image) -> str:
    release = f" for Flatcar {image.release.version}" if image.release else ""
    return f"{image.variant} {image.driver.version}{release}"


def _status(outcome: Outcome) -> str:
    if not outcome.planned or outcome.status is Status.SKIPPED:
        return outcome.status.value
    return {Status.BUILT: "would build", Status.TAGGED: "would tag",
            Status.FAILED: "would fail"}.get(outcome.status, outcome.status.value)  # fmt: skip


def summary(
    outcomes: Iterable[Outcome], excluded: Iterable[Exclusion], repository: Repository | str
) -> str:
    """The table printed at the end: one row per image and per exclusion, then the counts."""
    outcomes, excluded = list(outcomes), list(excluded)
    rows = [(_status(o), _label(o.image), ",".join(o.image.arches), o.image.tags.tags[0],
             o.detail) for o in outcomes]  # fmt: skip
    rows += [(Status.EXCLUDED.value, f"{x.variant} {x.driver} for Flatcar {x.flatcar}", x.arch,
              "-", x.reason) for x in excluded]  # fmt: skip
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[0]] = counts.get(row[0], 0) + 1
    total = ", ".join(f"{status} {count}" for status, count in counts.items())
    header = f"Summary for {repository}:\n"
    table = format_table(("STATUS", "IMAGE", "ARCHES", "TAG", "DETAIL"), rows)
    return f"{header}{table}{total or 'nothing to publish'}\n"


def failures(outcomes: Iterable[Outcome]) -> list[Outcome]:
    """The images that failed (a dry run's predicted failures are not failures of the run)."""
    return [o for o in outcomes if o.status is Status.FAILED and not o.planned]
